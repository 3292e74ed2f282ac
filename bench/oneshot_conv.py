"""One-shot pruning of a float32 conv model written by others, then compression, within 1% output error.

    python bench/oneshot_conv.py [--models iris_landmark] [--sparsities 0.2] [--max-loss 0.01]
                                 [--rerun-unpruned] [--reuse]

For each MediaPipe model (bench/builders/nonclassifier_data.py: the model from its PyPI wheel, 64 calibration
photos, 64 disjoint test photos and 64 photos for the Hessians, disjoint from both), through the
`dsz` CLI as a user would run it:

    dsz prune MODEL --method oneshot --layers all --sparsity conv1=S,... --data calib/ -o pruned.tflite
        (the CONV_2D layers only: SparseGPT on a 3x3 depthwise kernel, 9 weights per channel, costs
        1.35% output error on iris_landmark at 10%, against 0.17% for the CONV_2D layers alone)
    dsz compress pruned.tflite --data calib/ --metric output-error --max-loss B -o out.dsz
        where B = sqrt(max_loss^2 - e^2), e the pruned model's error on calib: the two perturbations
        are independent, so their errors add in quadrature (as compress combines its layers');
        then the same with --compensate (Hessians on calib/, the photos the bounds are chosen on) and
        with --compensate --calibration hessian/ (Hessians on photos the decisions never see)
    dsz eval out.dsz --reference MODEL --metric output-error --data calib/ | test/

against (a) `dsz compress MODEL` of the unpruned model at max_loss (taken from
bench/results/nonclassifiers.json unless --rerun-unpruned: the same command, 15 minutes on iris) and
(b) pack-only: `dsz pack MODEL --error-bound EB --layers all` with the largest single bound EB whose
error on the calibration photos is within max_loss (bisection on log EB). Every error is measured
against the ORIGINAL model. Prints one table; writes bench/results/oneshot_conv.json and .png.
--reuse keeps the .dsz files an earlier run left in the work folder (only when the pruned model
came out byte for byte the same) and measures them again; their rows say "reused".
The machine was shared with other jobs: the seconds are indicative only.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent / "builders"))
import nonclassifier_data as nd  # noqa: E402

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
DSZ = os.environ.get("DSZ", str(Path(sys.executable).with_name("dsz")))
BISECT_STEPS = 9  # 1000x bracket to within 1.4%


def run(cmd: list, log: Path) -> subprocess.CompletedProcess:
    """One CLI command, logged; a failure stops the bench with its message (these steps depend on each other)."""
    start = time.perf_counter()
    p = subprocess.run([str(c) for c in cmd], capture_output=True, text=True)
    with open(log, "a") as f:
        f.write(f"$ {shlex.join(map(str, cmd))}\n[rc {p.returncode}, {time.perf_counter() - start:.1f} s]\n"
                f"{p.stdout}{p.stderr[-2000:]}\n")
    if p.returncode != 0:
        raise SystemExit(f"failed: {shlex.join(map(str, cmd))}\n{p.stderr.strip()[-1500:]}")
    p.seconds = time.perf_counter() - start
    return p


def error(model: Path, original: Path, folder: Path, normalize: str, log: Path) -> float:
    """dsz eval's output error of `model` (.tflite or .dsz) against the original on a folder of photos."""
    p = run([DSZ, "eval", model, "--reference", original, "--metric", "output-error", "--data", folder,
             f"--normalize={normalize}", "--json"], log)
    return float(json.loads(p.stdout)["value"])


def pack_only(model: Path, calib: Path, test: Path, normalize: str, max_loss: float, work: Path, log: Path) -> dict:
    """The largest single --error-bound whose calibration error is within max_loss (bisection on log scale)."""
    lo, hi = 1e-4, 1e-1  # lo passes (checked), hi fails (checked); far smaller bounds pack slowly
    packed = work / "pack.dsz"
    trials = []
    for bound in (lo, hi):
        run([DSZ, "pack", model, "--error-bound", bound, "--layers", "all", "-o", packed, "-q"], log)
        trials.append((bound, error(packed, model, calib, normalize, log)))
    if trials[0][1] > max_loss or trials[1][1] <= max_loss:
        raise SystemExit(f"pack-only: bounds {lo:g}..{hi:g} do not bracket {max_loss} ({trials})")
    for _ in range(BISECT_STEPS):
        mid = math.sqrt(lo * hi)
        run([DSZ, "pack", model, "--error-bound", f"{mid:.4g}", "--layers", "all", "-o", packed, "-q"], log)
        e = error(packed, model, calib, normalize, log)
        trials.append((float(f"{mid:.4g}"), e))
        lo, hi = (mid, hi) if e <= max_loss else (lo, mid)
    bound = float(f"{lo:.4g}")
    run([DSZ, "pack", model, "--error-bound", bound, "--layers", "all", "-o", packed, "-q"], log)
    return {"config": f"pack-only, eb {bound:.3g}", "bound": bound, "dsz_bytes": packed.stat().st_size,
            "calib_error": error(packed, model, calib, normalize, log),
            "test_error": error(packed, model, test, normalize, log), "bisection": trials}


def prune(model: Path, layers: list, sparsity: float, calib: Path, normalize: str, out: Path, log: Path) -> dict:
    pairs = ",".join(f"{name}={sparsity}" for name in layers)
    p = run([DSZ, "prune", model, "--method", "oneshot", "--layers", "all", "--sparsity", pairs, "--data", calib,
             f"--normalize={normalize}", "-o", out], log)
    seconds = re.search(r"^seconds per layer: (.*)$", p.stdout, re.M)
    per_layer = {k: float(v) for k, v in (item.split("=") for item in seconds.group(1).split(", "))}
    method = re.search(r"^method: (\w+)", p.stdout, re.M).group(1)
    hessian = re.search(r"^Hessian memory: (.*)$", p.stdout, re.M).group(1)
    return {"seconds": p.seconds, "seconds_per_layer": per_layer, "method": method, "hessian": hessian}


# (label, file suffix, extra compress arguments; "HESSIAN" stands for the hessian/ folder)
CONFIGS = [("compress", "", []), ("compress --compensate", "_comp", ["--compensate"]),
           ("compress --compensate --calibration hessian/", "_calib", ["--compensate", "--calibration", "HESSIAN"])]


def compress(model: Path, calib: Path, normalize: str, max_loss: float, extra: list, out: Path, log: Path) -> float:
    run([DSZ, "compress", model, "--data", calib, f"--normalize={normalize}", "--metric", "output-error",
         "--max-loss", f"{max_loss:.5f}", "--layers", "all", *extra, "-o", out, "-q"], log)
    return out.stat().st_size


def bench_model(name: str, sparsities: list, max_loss: float, rerun_unpruned: bool, reuse: bool, work: Path,
                log: Path) -> dict:
    from pydsz.model.graph import TFLiteModel
    from pydsz.prune.gptq import selectable

    spec = nd.BY_NAME[name]
    paths = nd.build(name)
    model, calib, test, norm = paths["model"], paths["calib"], paths["test"], spec.normalize
    hessian = nd.build_hessian(name)
    work = work / name
    work.mkdir(parents=True, exist_ok=True)
    m = TFLiteModel(model.read_bytes())
    convs = [l.name for l in selectable(m, ("fc", "conv")) if l.op != "DEPTHWISE_CONV_2D"]
    file_bytes = model.stat().st_size
    rows = []
    print(f"[{time.strftime('%H:%M:%S')}] {name}: pack-only bisection", flush=True)
    rows.append(pack_only(model, calib, test, norm, max_loss, work, log))

    if rerun_unpruned:
        print(f"[{time.strftime('%H:%M:%S')}] {name}: compress unpruned", flush=True)
        start = time.perf_counter()
        size = compress(model, calib, norm, max_loss, [], work / "unpruned.dsz", log)
        rows.append({"config": "compress unpruned", "dsz_bytes": size, "seconds": time.perf_counter() - start,
                     "calib_error": error(work / "unpruned.dsz", model, calib, norm, log),
                     "test_error": error(work / "unpruned.dsz", model, test, norm, log)})
    else:
        earlier = {r["model"]: r for r in json.loads((RESULTS / "nonclassifiers.json").read_text())["rows"]}[name]
        rows.append({"config": "compress unpruned (nonclassifiers.json)", "dsz_bytes": earlier["dsz_bytes"],
                     "seconds": earlier["compress_seconds"], "calib_error": earlier["calib_error"],
                     "test_error": earlier["test_error_cli"], "provenance": earlier.get("provenance")})

    for s in sparsities:
        pruned = work / f"pruned_{s}.tflite"
        before = pruned.read_bytes() if pruned.exists() else None
        print(f"[{time.strftime('%H:%M:%S')}] {name}: one-shot prune {s}", flush=True)
        info = prune(model, convs, s, calib, norm, pruned, log)
        same_pruned = before == pruned.read_bytes()
        e_calib, e_test = error(pruned, model, calib, norm, log), error(pruned, model, test, norm, log)
        info.update(config=f"pruned {s} (no coding)", dsz_bytes=None, calib_error=e_calib, test_error=e_test,
                    sparsity=s, pruned_layers=len(convs))
        rows.append(info)
        left = math.sqrt(max(max_loss ** 2 - e_calib ** 2, 0.0))
        for title, suffix, extra in CONFIGS:
            label = f"pruned {s} + {title}"
            out = work / f"pruned_{s}{suffix}.dsz"
            row = {"config": label, "sparsity": s, "compress_max_loss": left}
            if reuse and same_pruned and out.exists():
                print(f"[{time.strftime('%H:%M:%S')}] {name}: {label}: reusing {out}", flush=True)
                row.update(reused=True, seconds=None)
            else:
                print(f"[{time.strftime('%H:%M:%S')}] {name}: {label} at {left:.4f}", flush=True)
                start = time.perf_counter()
                compress(pruned, calib, norm, left, [hessian if a == "HESSIAN" else a for a in extra], out, log)
                row["seconds"] = time.perf_counter() - start
            row.update(dsz_bytes=out.stat().st_size, calib_error=error(out, model, calib, norm, log),
                       test_error=error(out, model, test, norm, log),
                       hessian_error=error(out, model, hessian, norm, log))
            rows.append(row)
    pack = rows[0]["dsz_bytes"]
    for r in rows:
        if r.get("dsz_bytes"):
            r["file_ratio"] = file_bytes / r["dsz_bytes"]
            r["vs_pack_only"] = pack / r["dsz_bytes"]
    return {"model": name, "file_bytes": file_bytes, "conv_layers_pruned": convs, "max_loss": max_loss,
            "hessian_photos": str(hessian), "rows": rows}


def table(result: dict) -> str:
    from pydsz.tables import format_table

    lines = [f"{result['model']}: {result['file_bytes']} bytes float32; every error against the original model, "
             f"budget {result['max_loss']:g}"]
    body = []
    for r in result["rows"]:
        body.append([r["config"] + (" (reused)" if r.get("reused") else ""), r["dsz_bytes"] or "-",
                     f"{r['file_ratio']:.2f}x" if r.get("file_ratio") else "-",
                     f"{r['vs_pack_only']:.3f}" if r.get("vs_pack_only") else "-",
                     f"{r['calib_error']:.4f}", f"{r['test_error']:.4f}",
                     f"{r['hessian_error']:.4f}" if "hessian_error" in r else "-",
                     f"{r['seconds']:.0f}" if r.get("seconds") is not None else "-"])
    lines.append(format_table(["config", ".dsz B", "file x", "vs pack-only", "calib err", "test err", "hessian err",
                                      "s"], body))
    for r in result["rows"]:
        if "seconds_per_layer" in r:
            t = r["seconds_per_layer"]
            lines.append(f"{r['config']}: {len(t)} layers, {sum(t.values()):.1f} s in all, {sum(t.values()) / len(t):.2f} "
                         f"s per layer (max {max(t.values()):.2f}); {r['hessian']}; method {r['method']}")
    return "\n".join(lines)


def plot(results: list, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(results), figsize=(6.4 * len(results), 4.2), squeeze=False)
    for ax, res in zip(axes[0], results):
        for r in res["rows"]:
            if r.get("file_ratio"):
                ax.scatter([r["file_ratio"]], [r["test_error"]], s=40, label=r["config"])
        ax.axhline(res["max_loss"], ls="--", lw=1, color="grey", label=f"budget (on calib) {res['max_loss']:g}")
        ax.set_xlabel(".tflite bytes / .dsz bytes")
        ax.set_ylabel("output error on the test photos vs original")
        ax.set_title(f"{res['model']}: one-shot pruning + compress vs pack-only")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="iris_landmark")
    parser.add_argument("--sparsities", default="0.2")
    parser.add_argument("--max-loss", type=float, default=0.01)
    parser.add_argument("--rerun-unpruned", action="store_true")
    parser.add_argument("--reuse", action="store_true", help="measure the .dsz files an earlier run left, "
                        "where the pruned model came out the same, instead of compressing again")
    parser.add_argument("--out", type=Path, default=RESULTS / "oneshot_conv.json")
    args = parser.parse_args(argv)
    work = nd.DEFAULT_CACHE / "oneshot_conv"
    work.mkdir(parents=True, exist_ok=True)
    log = work / "commands.log"
    results = [bench_model(name, [float(s) for s in args.sparsities.split(",")], args.max_loss,
                           args.rerun_unpruned, args.reuse, work, log) for name in args.models.split(",")]
    for res in results:
        print(table(res))
    args.out.write_text(json.dumps({"dsz": DSZ, "results": results}, indent=1, default=str))
    plot(results, args.out.with_suffix(".png"))
    print(f"wrote {args.out} and {args.out.with_suffix('.png')}; commands: {log}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
