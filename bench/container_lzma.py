"""The .dsz container's lossless parts two ways, on the files the zoo's command writes, measured in one run:
as container formats 1-3 hold them (the tensor table raw, the rest of the model as zstd -19 of all its
bytes with the compressed tensors zeroed) against format 4's LZMA2 (the table packed, the rest as the
bytes outside the compressed tensors alone; pydsz.encode.pack takes each where smaller).

For each model of bench/zoo.py: its command (`dsz compress MODEL --data decision.npz --metric output-error
--max-loss 0.01 --layers all`), or the .dsz files in --from; the file's entries serialized both ways; the
bytes of each, and the time to decode the whole model (table, rest and tensors) and the rest alone, the
best of --reps, the two alternated so that they share the machine's noise. Nothing is decided
differently: the entries are the same, only the lossless coding around them differs.

    nice -n 10 python3 bench/container_lzma.py [--models a,b] [--from DIR] [--json PATH]
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "bench"), str(ROOT / "bench" / "builders")]

import zoo  # noqa: E402  (bench/zoo.py)
import zoo_data  # noqa: E402

from bench.machine import machine_info  # noqa: E402
from pydsz.encode import pack  # noqa: E402
from pydsz.format import container  # noqa: E402
from pydsz.tables import format_table  # noqa: E402


def both_ways(dsz: bytes) -> dict:
    """The .dsz's entries serialized as formats 1-3 would ("zstd": pack's LZMA2 never smaller) and as pack
    does now ("chosen")."""
    m = container.load(dsz)
    model = m.tflite_bytes()
    chosen = pack._serialize(model, m.entries)
    lzma_tables, pack.lzma_tables = pack.lzma_tables, lambda raw: raw + bytes(64)
    try:
        old = pack._serialize(model, m.entries)
    finally:
        pack.lzma_tables = lzma_tables
    return {"zstd": old, "chosen": chosen}


def _table_bytes(dsz: bytes) -> int:
    return container.HEADER.unpack_from(dsz)[4]


def best_times(files: dict, reps: int) -> dict:
    """Per file: the best whole-decode and rest-only seconds over `reps` alternated rounds."""
    best = {k: [np.inf, np.inf] for k in files}
    for _ in range(reps):
        for k, b in files.items():
            t0 = time.perf_counter()
            m = container.load(b)
            m.tflite_bytes()
            t1 = time.perf_counter()
            out = np.empty(m._model_bytes, np.uint8)
            t2 = time.perf_counter()
            m.inflate_rest(out)
            t3 = time.perf_counter()
            best[k] = [min(best[k][0], t1 - t0), min(best[k][1], t3 - t2)]
    return best


def measure(name: str, dsz: bytes, reps: int) -> dict:
    files = both_ways(dsz)
    decoded = {k: container.load(b).tflite_bytes() for k, b in files.items()}
    assert decoded["zstd"] == decoded["chosen"]
    times = best_times(files, reps)
    chosen = container.load(files["chosen"])
    return {"model": name, "model_bytes": chosen._model_bytes, "codec": chosen.rest_codec, "version": chosen.version,
            "file_zstd": len(files["zstd"]), "file_chosen": len(files["chosen"]),
            "rest_zstd": len(container.load(files["zstd"])._rest), "rest_chosen": len(chosen._rest),
            "table_zstd": _table_bytes(files["zstd"]), "table_chosen": _table_bytes(files["chosen"]),
            "decode_ms_zstd": 1e3 * times["zstd"][0], "decode_ms_chosen": 1e3 * times["chosen"][0],
            "rest_ms_zstd": 1e3 * times["zstd"][1], "rest_ms_chosen": 1e3 * times["chosen"][1]}


def plot(rows: list, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [r["model"] for r in rows]
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 0.35 * len(rows) + 1.5), sharey=True)
    a.barh(names, [100 * (r["file_chosen"] / r["file_zstd"] - 1) for r in rows], color="tab:green")
    a.set_xlabel(".dsz bytes against formats 1-3's (%)")
    b.barh(names, [r["decode_ms_chosen"] / r["decode_ms_zstd"] for r in rows], color="tab:blue")
    b.axvline(1.0, color="k", lw=0.8)
    b.set_xlabel("whole decode time against formats 1-3's (x)")
    a.invert_yaxis()
    fig.suptitle("The container's table and rest: format 4's LZMA2 against formats 1-3's raw table and zstd rest")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=",".join(m.name for m in zoo_data.MODELS))
    ap.add_argument("--from", dest="folder", type=Path, help="NAME.dsz files the zoo's command wrote (else run it)")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--json", type=Path, default=ROOT / "bench/results/container_lzma.json")
    args = ap.parse_args()
    info = machine_info()
    print(f"{info['cpu']} ({info['cores']} cores), {info['platform']}, numpy {info['numpy']}")
    rows, skipped = [], {}
    for name in args.models.split(","):
        size = zoo_data.model_path(name).stat().st_size
        if size > container.LZMA_REST_MAX:
            skipped[name] = f"{size:,} bytes: over LZMA_REST_MAX, its rest stays zstd"
            print(f"{name}: {skipped[name]}")
            continue
        found = args.folder / f"{name}.dsz" if args.folder else None
        if found is not None and found.exists():
            dsz = found.read_bytes()
        else:
            paths = zoo_data.build(name)
            with tempfile.TemporaryDirectory() as tmp:
                got = zoo.compress(paths["model"], paths["decision"], 0.01, Path(tmp) / "m.dsz", 7200)
                if "failed" in got:
                    print(f"{name}: dsz compress failed: {got['failed'][-300:]}")
                    continue
                dsz = (Path(tmp) / "m.dsz").read_bytes()
        rows.append(measure(name, dsz, args.reps))
        print(f"{name}: {rows[-1]['file_zstd']} -> {rows[-1]['file_chosen']} bytes ({rows[-1]['codec']})", flush=True)
    print(format_table(["model", "model B", "rest", "table B was", "table B", "rest B was", "rest B", ".dsz B was",
                        ".dsz B", "change", "decode ms was", "decode ms", "rest ms was", "rest ms"],
                       [[r["model"], r["model_bytes"], r["codec"], r["table_zstd"], r["table_chosen"], r["rest_zstd"],
                         r["rest_chosen"], r["file_zstd"],
                         r["file_chosen"], f"{100 * (r['file_chosen'] / r['file_zstd'] - 1):+.2f}%",
                         r["decode_ms_zstd"], r["decode_ms_chosen"], r["rest_ms_zstd"], r["rest_ms_chosen"]]
                        for r in rows]))
    changes = sorted(r["file_chosen"] / r["file_zstd"] - 1 for r in rows)
    print(f"files: median {100 * changes[len(changes) // 2]:+.2f}% ({100 * changes[0]:+.2f}% to "
          f"{100 * changes[-1]:+.2f}%) on {len(rows)} models")
    args.json.write_text(json.dumps({"machine": info, "command": " ".join(["python3 bench/container_lzma.py", *sys.argv[1:]]), "rows": rows,
                                     "skipped": skipped}, indent=1) + "\n")
    plot(rows, args.json.with_suffix(".png"))
    print(f"wrote {args.json} and {args.json.with_suffix('.png')}")


if __name__ == "__main__":
    main()
