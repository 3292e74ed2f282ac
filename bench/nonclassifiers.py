"""pydsz on real non-classifier models (landmarks, detection, segmentation) through the `dsz` CLI.

    python bench/nonclassifiers.py [--cache DIR] [--models a,b] [--max-loss 0.01]

For each model of bench/builders/nonclassifier_data.py (MediaPipe models shipped in PyPI wheels) and its two
disjoint folders of real photos, this runs what a user would run:

    dsz pack MODEL --error-bound 0 --layers all -o pack.dsz              (lossless baseline)
    dsz compress MODEL --data calib/ --normalize R --metric output-error --max-loss 0.01
                 --layers all -o out.dsz --report report/
    dsz eval out.dsz --reference MODEL --metric output-error --data test/ --normalize R --json

and prints one table (sizes, ratios, the output error on the calibration folder from report.json
and on the unseen test folder). It also measures the test error itself, independently of pydsz's
runtime: `dsz decompress`, then the original and the decoded model each run by LiteRT one image at a
time (MediaPipe graphs hard-code a batch of 1), the same per-sample relative L2 error, worst output
per sample, averaged. Where the two disagree the table says so: that is a bug in one of them.

A failing command is recorded (its exact command line and message) and the bench goes on with the
next model: these are other people's models, and what the CLI does with them is the point.
Writes bench/results/nonclassifiers.json and bench/results/nonclassifiers.png.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent / "builders"))
import nonclassifier_data as nd  # noqa: E402

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
# The lead's environment: an editable install of the project, so this measures the CLI as it is now.
DSZ = os.environ.get("DSZ", str(Path(sys.executable).with_name("dsz")))

# Which output holds landmarks, and how many numbers make one point: the error in pixels of the
# model's input is what a user of a landmark model would look at.
LANDMARKS = {"face_landmark": (0, 3), "iris_landmark": (1, 3), "hand_recrop": (0, 2)}


# --normalize is passed as --normalize=R: argparse reads a separate "-1,1" as an option
# ("argument --normalize: expected one argument"), so the two-word form fails for -1,1.


def run(cmd: list, log: Path) -> dict:
    """Run one CLI command; its rc, seconds, stdout and the last lines of stderr (progress bars off)."""
    t0 = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, text=True)
    seconds = time.perf_counter() - t0
    with open(log, "a") as f:
        f.write(f"$ {shlex.join(cmd)}\n[rc {p.returncode}, {seconds:.1f} s]\n{p.stdout}{p.stderr}\n")
    return {"cmd": shlex.join(cmd), "rc": p.returncode, "seconds": round(seconds, 2), "stdout": p.stdout,
            "stderr": "\n".join(p.stderr.strip().splitlines()[-6:])[-4000:]}


def zstd19(data: bytes) -> int:
    import zstandard

    return len(zstandard.ZstdCompressor(level=19).compress(data))


def outputs_one_by_one(model: Path, images: np.ndarray) -> list:
    """Every output for every image, the interpreter invoked once per image at batch 1 (the shape the
    model was exported with), in the model's output order."""
    from ai_edge_litert.interpreter import Interpreter

    it = Interpreter(model_path=str(model), num_threads=1)
    it.allocate_tensors()
    inp = it.get_input_details()[0]
    outs = it.get_output_details()
    res = [[] for _ in outs]
    for x in images:
        it.set_tensor(inp["index"], x[None].astype(inp["dtype"]))
        it.invoke()
        for k, d in enumerate(outs):
            res[k].append(it.get_tensor(d["index"]).reshape(-1).astype(np.float64))
    return [np.stack(r) for r in res]


def relative_errors(new: list, ref: list) -> np.ndarray:
    """Per sample: ||new - ref|| / ||ref|| for each output, the worst output's. The denominator is at
    least a tenth of the output's RMS norm over the samples, as output-error defines it: a score near 0
    (face_landmark's face logit on a profile crop) would otherwise read a change of 0.04 as 17%."""
    per_output = []
    for a, r in zip(new, ref):
        norms = np.linalg.norm(r, axis=1)
        typical = float(np.sqrt(np.mean(norms ** 2))) if norms.size else 0.0
        per_output.append(np.linalg.norm(a - r, axis=1) / np.maximum(norms, 0.1 * typical if typical > 0 else 1.0))
    return np.max(np.stack(per_output), axis=0)


def independent_check(name: str, original: Path, decoded: Path, folder: Path, spec) -> dict:
    """The test error measured without pydsz's runtime (see the module doc)."""
    from PIL import Image

    from pydsz.model.graph import TFLiteModel

    shape = TFLiteModel.from_file(original).input_details()[0]["shape"]
    low, high = {"0,1": (0.0, 1.0), "-1,1": (-1.0, 1.0)}[spec.normalize]
    files = sorted(folder.glob("*.png"))
    x = np.stack([np.asarray(Image.open(f).convert("RGB").resize((shape[2], shape[1]), Image.BILINEAR), np.float32)
                  for f in files]) * np.float32((high - low) / 255.0) + np.float32(low)
    ref = outputs_one_by_one(original, x)
    new = outputs_one_by_one(decoded, x)
    err = relative_errors(new, ref)
    out = {"mean": float(err.mean()), "p95": float(np.percentile(err, 95)), "max": float(err.max()),
           "samples": len(files)}
    if name in LANDMARKS:
        k, dims = LANDMARKS[name]
        a, r = new[k].reshape(len(files), -1, dims), ref[k].reshape(len(files), -1, dims)
        shift = np.linalg.norm((a - r)[..., :2], axis=-1)  # x, y in the input's pixels
        out["landmark_shift_px"] = {"mean": float(shift.mean()), "max": float(shift.max())}
    return out


def bench_model(name: str, cache: Path, work: Path, max_loss: float, log: Path,
                reuse: Optional[dict] = None) -> dict:
    """One model through pack, compress, eval and decompress. reuse: this model's row of an
    earlier run whose compress succeeded: its out.dsz and report are kept, eval and the checks rerun."""
    spec = nd.BY_NAME[name]
    dsz = [DSZ]
    paths = nd.build(name, cache)
    model, calib, test = paths["model"], paths["calib"], paths["test"]
    data = model.read_bytes()
    from pydsz.model.graph import TFLiteModel

    m = TFLiteModel(data)
    layers = m.layers(("fc", "conv"))
    row = {"model": name, "runner": "dsz", "source": f"{spec.package} {spec.member}", "weights": spec.weights,
           "normalize": spec.normalize, "file_bytes": len(data), "zstd19_bytes": zstd19(data),
           "layers": len(layers), "compressible_layers": sum(l.compressible for l in layers),
           "compressible_bytes": sum(l.nbytes for l in layers if l.compressible),
           "calib_images": len(list(calib.glob("*.png"))), "test_images": len(list(test.glob("*.png"))),
           "failures": []}
    d = work / name
    d.mkdir(parents=True, exist_ok=True)

    pack = run([*dsz, "pack", str(model), "--error-bound", "0", "--layers", "all", "-o", str(d / "pack.dsz"), "-q"], log)
    if pack["rc"] == 0:
        row["pack_lossless_bytes"] = (d / "pack.dsz").stat().st_size
    else:
        row["failures"].append({k: pack[k] for k in ("cmd", "rc", "stderr")})

    out = d / "out.dsz"
    if reuse and reuse.get("dsz_bytes") and out.exists() and out.stat().st_size == reuse["dsz_bytes"]:
        comp = {"cmd": reuse["compress_cmd"], "seconds": reuse["compress_seconds"], "rc": 0}
        row["reused_compress_from"] = reuse.get("provenance")
    else:
        for stale in (out, d / "report" / "report.json"):
            stale.unlink(missing_ok=True)  # a result from an earlier run must not pass for this one
        comp = run([*dsz, "compress", str(model), "--data", str(calib), f"--normalize={spec.normalize}",
                    "--metric", "output-error", "--max-loss", str(max_loss), "--layers", "all",
                    "-o", str(out), "--report", str(d / "report"), "--quiet"], log)
    row["compress_cmd"], row["compress_seconds"] = comp["cmd"], comp["seconds"]
    if comp["rc"] != 0 or not out.exists():
        row["failures"].append({k: comp[k] for k in ("cmd", "rc", "stderr")})
        return row
    row["dsz_bytes"] = out.stat().st_size
    report_file = d / "report" / "report.json"
    if report_file.exists():
        report = json.loads(report_file.read_text())
        row["report_metric"] = report.get("metric")
        row["report_totals"] = report.get("totals")
        row["calib_error"] = (report.get("metric") or {}).get("measured_loss")
        row["layer_ratio"] = (report.get("totals") or {}).get("ratio")

    ev = run([*dsz, "eval", str(out), "--reference", str(model), "--metric", "output-error",
              "--data", str(test), f"--normalize={spec.normalize}", "--json"], log)
    row["eval_cmd"] = ev["cmd"]
    if ev["rc"] == 0:
        try:
            row["test_error_cli"] = json.loads(ev["stdout"]).get("value")
        except json.JSONDecodeError:
            row["failures"].append({"cmd": ev["cmd"], "rc": 0, "stderr": "stdout is not JSON: " + ev["stdout"][:300]})
    else:
        row["failures"].append({k: ev[k] for k in ("cmd", "rc", "stderr")})

    decoded = d / "decoded.tflite"
    dec = run([*dsz, "decompress", str(out), "-o", str(decoded)], log)
    if dec["rc"] == 0:
        row["test_error_independent"] = independent_check(name, model, decoded, test, spec)
        row["calib_error_independent"] = independent_check(name, model, decoded, calib, spec)
    else:
        row["failures"].append({k: dec[k] for k in ("cmd", "rc", "stderr")})
    return row


def fmt(v, spec="{:.4f}", none="-"):
    return none if v is None else spec.format(v)


def table(rows: list) -> str:
    head = (f"{'model':27s} {'weights':7s} {'file B':>9s} {'zstd19 B':>9s} {'pack B':>9s} {'layers':>7s} "
            f"{'.dsz B':>9s} {'lay.x':>6s} {'file.x':>6s} {'zstd.x':>6s} {'calib err':>9s} {'test err':>9s} "
            f"{'test(ind)':>9s} {'p95 ind':>8s} {'px shift':>8s} {'time s':>7s}")
    lines = [head, "-" * len(head)]
    for r in rows:
        dsz = r.get("dsz_bytes")
        ind = r.get("test_error_independent") or {}
        shift = (ind.get("landmark_shift_px") or {}).get("mean")
        lines.append(
            f"{r['model']:27s} {r['weights']:7s} {r['file_bytes']:9d} {r['zstd19_bytes']:9d} "
            f"{fmt(r.get('pack_lossless_bytes'), '{:d}'):>9s} {r['compressible_layers']:>3d}/{r['layers']:<3d} "
            f"{fmt(dsz, '{:d}'):>9s} {fmt(r.get('layer_ratio'), '{:.2f}'):>6s} "
            f"{fmt(dsz and r['file_bytes'] / dsz, '{:.2f}'):>6s} {fmt(dsz and r['zstd19_bytes'] / dsz, '{:.2f}'):>6s} "
            f"{fmt(r.get('calib_error')):>9s} {fmt(r.get('test_error_cli')):>9s} {fmt(ind.get('mean')):>9s} "
            f"{fmt(ind.get('p95')):>8s} {fmt(shift, '{:.3f}'):>8s} {fmt(r.get('compress_seconds'), '{:.0f}'):>7s}")
        cli, mine = r.get("test_error_cli"), ind.get("mean")
        if cli is not None and mine is not None and abs(cli - mine) > 0.05 * max(abs(mine), 1e-4):
            lines.append(f"  ! dsz eval says {cli:.4g}, one-image-at-a-time LiteRT says {mine:.4g}")
        for f in r["failures"]:
            msg = f["stderr"] if len(f["stderr"]) <= 400 else f["stderr"][:400] + " [...] (whole message in the JSON)"
            lines.append(f"  ! rc {f['rc']}: {f['cmd']}\n    {msg.replace(chr(10), chr(10) + '    ')}")
    return "\n".join(lines)


def plot(rows: list, path: Path, max_loss: float) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for i, r in enumerate(rows):
        ind = r.get("test_error_independent") or {}
        if r.get("dsz_bytes") and ind:
            x = r["file_bytes"] / r["dsz_bytes"]
            ax.scatter([x], [ind["mean"]], s=40)
            ax.errorbar([x], [ind["mean"]], yerr=[[0], [ind["p95"] - ind["mean"]]], fmt="none", alpha=0.5)
            label = f"{r['model']} ({r['weights']})"
            ax.annotate(label, (x, ind["mean"]), textcoords="offset points",
                        xytext=(5, 4 + 12 * (i % 2)), fontsize=8)  # alternate heights: close points'
                                                                     # labels would overlap
    ax.axhline(max_loss, ls="--", lw=1, color="grey", label=f"budget (calib) {max_loss:g}")
    ax.set_xlabel(".tflite bytes / .dsz bytes")
    ax.set_ylabel("output error on unseen photos (mean; bar to p95)")
    ax.set_title("pydsz on MediaPipe models (real photos, output-error budget)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def provenance() -> dict:
    """Which pydsz ran: the lead's editable install changes under the bench, so the commit and any
    uncommitted files of pydsz/ go with the numbers."""
    import pydsz

    root = Path(pydsz.__file__).resolve().parent.parent

    def git(*a):
        p = subprocess.run(["git", "-C", str(root), *a], capture_output=True, text=True)
        return p.stdout.strip() if p.returncode == 0 else None

    return {"pydsz": str(root), "commit": git("rev-parse", "--short", "HEAD"),
            "uncommitted": (git("status", "--porcelain", "--", "pydsz") or "").splitlines()}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cache", type=Path, default=nd.DEFAULT_CACHE)
    parser.add_argument("--models", default=",".join(nd.BY_NAME))
    parser.add_argument("--max-loss", type=float, default=0.01)
    parser.add_argument("--reuse", action="store_true",
                        help="keep the .dsz of an earlier successful compress (rows of --out); rerun eval and checks")
    parser.add_argument("--out", type=Path, default=RESULTS / "nonclassifiers.json")
    args = parser.parse_args(argv)
    work = args.cache / "runs"
    work.mkdir(parents=True, exist_ok=True)
    log = work / "commands.log"
    prov = provenance()
    print(f"pydsz {prov['pydsz']} at {prov['commit']}" + (f", uncommitted: {' '.join(prov['uncommitted'])}"
                                                            if prov["uncommitted"] else ""))
    earlier = {}
    if args.reuse and args.out.exists():
        earlier = {(r["model"], r.get("runner", "dsz")): r for r in json.loads(args.out.read_text())["rows"]}
    rows = []
    for name in args.models.split(","):
        print(f"[{time.strftime('%H:%M:%S')}] {name} ...", flush=True)
        row = bench_model(name, args.cache, work, args.max_loss, log, earlier.get((name, "dsz")))
        row["provenance"] = prov
        rows.append(row)
    print(table(rows))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    previous = {}
    if args.out.exists():  # a run of some models keeps the others' rows
        previous = {(r["model"], r.get("runner", "dsz")): r for r in json.loads(args.out.read_text()).get("rows", [])}
    previous.update({(r["model"], r["runner"]): r for r in rows})
    ordered = [previous[(m.name, runner)] for m in nd.MODELS for runner in ("dsz",)
               if (m.name, runner) in previous]
    args.out.write_text(json.dumps({"max_loss": args.max_loss, "dsz": DSZ, "rows": ordered}, indent=1, default=str))
    plot(ordered, args.out.with_suffix(".png"), args.max_loss)
    print(f"wrote {args.out} and {args.out.with_suffix('.png')}; commands and full messages: {log}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
