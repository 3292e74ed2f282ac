"""Step 5's report: the per-layer table and the paper's totals, as text, JSON and a PNG of the curves."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

from pydsz.container import write_atomic
from pydsz.pipeline import Result, expected_losses
from pydsz.tables import format_table


def to_dict(result: Result, extra: Optional[dict] = None) -> dict:
    """Everything the report says, JSON-ready; `extra` (e.g. test-set accuracies) is merged at the top."""
    out = {
        "layers": [
            {"name": l.name, "shape": list(l.shape), "density": l.density, "bound": l.bound,
             "original_bytes": l.original_bytes, "data_bytes": l.data_bytes, "index_bytes": l.index_bytes,
             "stream_bytes": l.stream_bytes, "ratio": l.ratio, "measured_drop_alone": l.drop}
            for l in result.layers
        ],
        "totals": {
            "fc_original_bytes": result.fc_original_bytes, "fc_compressed_bytes": result.fc_compressed_bytes,
            "ratio": result.ratio, "model_bytes": result.model_bytes, "dsz_bytes": len(result.dsz),
            "file_ratio": result.file_ratio, "top1_before": result.top1_before,
            "top1_after": result.top1_after, "measured_loss": result.loss, "max_loss": result.max_loss,
            "allowed_drop_samples": result.allowed_drop, "samples": result.samples,
            "reference_top1": result.reference_top1, "margin": result.margin,
            "fast_evaluation": result.fast_evaluation, "device": result.device, "cpu_reason": result.cpu_reason,
        },
        "verification": result.attempts,
        "curves": {name: [p.as_dict() for p in points] for name, points in result.curves.items()},
    }
    if extra:
        out.update(extra)
    return out


def layer_table(result: Result) -> str:
    """Per layer: shape, density, bound, data bytes, index bytes, ratio, measured drop (alone)."""
    rows = [[l.name, "x".join(map(str, l.shape)), f"{l.density:.3f}", "lossless" if l.bound == 0 else f"{l.bound:.3g}",
             l.data_bytes, l.index_bytes, f"{l.ratio:.1f}x", f"{100 * l.drop:+.2f}"] for l in result.layers]
    return format_table(["layer", "shape", "density", "bound", "data B", "index B", "ratio", "drop %"], rows)


def totals_line(result: Result) -> str:
    """The paper's totals: layers' size before and after, ratio, top-1 before and after."""
    return (f"compressed layers: {result.fc_original_bytes / 1024:.1f} KB -> {result.fc_compressed_bytes / 1024:.1f} KB "
            f"({result.ratio:.1f}x; whole file {result.model_bytes} -> {len(result.dsz)} bytes, "
            f"{result.file_ratio:.1f}x); top-1 {100 * result.top1_before:.2f}% -> {100 * result.top1_after:.2f}% "
            f"(measured loss {100 * result.loss:.2f} points, max {100 * result.max_loss:.2f}, "
            f"{result.samples} samples)")


def plot_curves(result: Result, path) -> None:
    """A PNG with each layer's accuracy drop vs error bound and the chosen bound marked."""
    import io

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(result.curves)
    fig, axes = plt.subplots(1, len(names), figsize=(4.2 * len(names), 3.4), squeeze=False)
    chosen = {l.name: l.bound for l in result.layers}
    budget = 100 * result.allowed_drop / result.samples
    for ax, name in zip(axes[0], names):
        points = [p for p in result.curves[name] if p.bound > 0]
        ax.plot([p.bound for p in points], [100 * p.drop / result.samples for p in points], "o-", ms=3,
                label="measured, alone")
        expected = expected_losses(result.curves[name], result.margin)[-len(points):] if points else []
        ax.plot([p.bound for p in points], [100 * e / result.samples for e in expected], "-", lw=1, color="orange",
                label=f"as optimized (+{result.margin:g} sd, monotone)")
        pick = next((p for p in points if p.bound == chosen.get(name)), None)
        if pick is not None:
            ax.plot([pick.bound], [100 * pick.drop / result.samples], "r*", ms=12, label=f"chosen {pick.bound:.3g}")
        ax.axhline(budget, color="gray", ls="--", lw=1, label="budget")
        ax.set_xscale("log")
        ax.set_title(name)
        ax.set_xlabel("absolute error bound")
        ax.set_ylabel("top-1 drop (points)")
        ax.legend(fontsize=7)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    write_atomic(path, buf.getvalue())


def write_report(result: Result, directory, extra: Optional[dict] = None) -> list[Path]:
    """report.json and curves.png in `directory` (created if needed); returns their paths."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    json_path, png_path = directory / "report.json", directory / "curves.png"
    write_atomic(json_path, json.dumps(to_dict(result, extra), indent=2).encode())
    plot_curves(result, png_path)
    return [json_path, png_path]
