"""What `dsz bench --layers fc` prints and writes of pydsz.bench.anchors.benchmark's results: the main
table, every point of the sweep, the summary lines with each target met or not, the plot and the JSON."""

from __future__ import annotations

import json
from pathlib import Path

from pydsz.bench.anchors import OURS, main_points
from pydsz.format import files
from pydsz.tables import format_table


def _setting(p: dict) -> str:
    if p["knob"] == "-":
        return "-"
    return f"{p['knob']} {p['setting']:g}" if isinstance(p["setting"], float) else f"{p['knob']} {p['setting']}"


def _value(info: dict, value: float) -> str:
    return f"{100 * value:.2f}%" if info["metric"]["discrete"] else f"{value:.4g}"


def _loss(info: dict, loss: float) -> str:
    """A loss as people read it: points of a discrete metric, else in the metric's own unit."""
    return f"{100 * loss:+.2f}" if info["metric"]["discrete"] else f"{loss:.3g}"


def main_table(info: dict) -> str:
    """One row per method at its main setting."""
    name = info["metric"]["name"]
    rows = []
    for p in main_points(info):
        rows.append([p["method"], _setting(p), p["fc_bytes"], p["file_bytes"], f"{p['ratio']:.1f}x",
                     _value(info, p["val_value"]), _value(info, p["test_value"]), _loss(info, p["test_loss"]),
                     f"{p['encode_s']:.2f}", f"{p['decode_s']:.4f}"])
    return format_table(["method", "setting", "FC bytes", "file bytes", "ratio", f"val {name}", f"test {name}",
                         "test loss", "encode s", "decode s"], rows)


def sweep_table(info: dict) -> str:
    """Every point of every curve: ratio and losses (from the model as given)."""
    rows = [[p["method"], _setting(p), f"{p['ratio']:.1f}x", _loss(info, p["val_loss"]), _loss(info, p["test_loss"])]
            for p in info["points"]]
    return format_table(["method", "setting", "ratio", "val loss", "test loss"], rows)


def summary_lines(info: dict) -> list[str]:
    o, p = info["original"], info["pruned"]
    lines = [f"{info['model']}: {info['metric']['name']} val/test {_value(info, o['val_value'])}/"
             f"{_value(info, o['test_value'])} as given, {_value(info, p['val_value'])}/{_value(info, p['test_value'])} "
             "pruned (" + ", ".join(f"{k}={v:.3f}" for k, v in p["sparsity"].items())
             + f"); FC layers {info['fc_original_bytes']} bytes dense float32; the rest of the model "
             f"{info['rest_bytes']} bytes (zstd-19); zstd-19 of the whole pruned file {p['zstd19_file_bytes']} bytes"]
    ours = [p for p in info["points"] if p["method"] == OURS]
    least = min(ours, key=lambda p: (p["test_loss"], -p["ratio"]))
    lines += [f"skipped: {s['method']} at budget {s['setting']:g}: {s['reason']}" for s in info.get("skipped", [])]
    for t in info["comparisons"]["targets"]:
        if "advantage" in t:
            main = next(p for p in info["points"] if p["method"] == t["method"] and p in main_points(info))
            adv = (f"{t['advantage']:.2f}x" if t["advantage"] is not None else
                   f"no pydsz point loses as little as {_loss(info, main['test_loss'])} "
                   f"(the least: {least['ratio']:.1f}x at {_loss(info, least['test_loss'])}, "
                   f"{main['ratio']:.1f}x for {t['method']})")
            if t["advantage_interpolated"] is not None:
                adv += f" ({t['advantage_interpolated']:.2f}x on pydsz's curve interpolated to that loss)"
            lines.append(f"{'MET' if t['met'] else 'NOT MET'}  {t['target']}: {adv}")
        else:
            where = [f"{what}: {', '.join(t[key])}" for key, what in
                     (("not_above", "below it"), ("loses_less_than_any_pydsz_point", "losing less than any pydsz point"))
                     if t[key]]
            lines.append(f"{'MET' if t['met'] else 'NOT MET'}  {t['target']}" + (f" ({'; '.join(where)})" if where else ""))
    return lines


def plot(info: dict) -> bytes:
    """Ratio (log) vs test loss, one curve per method, each point labelled with its setting, as PNG bytes."""
    import io

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5))
    scale = 100 if info["metric"]["discrete"] else 1  # points, or the metric's own unit
    for method in dict.fromkeys(p["method"] for p in info["points"]):
        pts = [p for p in info["points"] if p["method"] == method]
        knob = pts[0]["knob"]
        label = method if knob == "-" else f"{method} (over {knob})"
        xs, ys = [scale * p["test_loss"] for p in pts], [p["ratio"] for p in pts]
        ax.plot(xs, ys, "o-" if len(pts) > 1 else "s", ms=4, lw=2.2 if method == OURS else 1.2, label=label)
        if knob != "-":
            for p, x, y in zip(pts, xs, ys):
                ax.annotate(f"{p['setting']:g}", (x, y), fontsize=6, xytext=(3, 3), textcoords="offset points")
    ax.axvline(scale * info["max_loss"], color="gray", ls="--", lw=1, label=f"--max-loss {info['max_loss']:g}")
    ax.axvline(scale * info["pruned"]["test_loss"], color="gray", ls=":", lw=1, label="pruned, uncompressed")
    ax.set_yscale("log")
    ax.set_xlabel(f"{info['metric']['name']} loss on the test split ({'points, ' if scale == 100 else ''}"
                  "from the model before pruning)")
    ax.set_ylabel("FC layers: dense float32 bytes / stored bytes")
    ax.set_title(f"{info['model']}: every method on the same pruned model")
    ax.legend(fontsize=7)
    ax.grid(True, which="both", lw=0.3)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    return buf.getvalue()


def write_report(info: dict, directory, stem: str = "bench") -> list[Path]:
    """STEM.json (the results) and STEM.png (the curves) in `directory`, both or neither."""
    return files.write_files(directory, {f"{stem}.json": json.dumps(info, indent=1).encode(), f"{stem}.png": plot(info)})
