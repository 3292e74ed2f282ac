"""Step 5's report: the per-layer table and the paper's totals, as text, JSON and a PNG of the curves."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

from pydsz.compress.pipeline import Result, expected_losses
from pydsz.format.files import write_files
from pydsz.tables import format_table


def metric_dict(result: Result) -> dict:
    """Which metric judged the result, in which unit, and what it measured."""
    m = result.metric
    return {"name": m.name, "output": m.output, "unit": m.unit, "reason": result.metric_reason or None,
            "max_loss": result.max_loss, "allowed_loss": result.allowed_loss, "measured_loss": result.loss,
            "before": result.before, "after": result.after, "spent": result.spent,
            "samples": result.samples, "margin": result.margin, "decided": result.decided}


def to_dict(result: Result, extra: Optional[dict] = None) -> dict:
    """Everything the report says, JSON-ready; `extra` (e.g. test-set accuracies) is merged at the top."""
    out = {
        "metric": metric_dict(result),
        "layers": [
            {"name": l.name, "shape": list(l.shape), "density": l.density, "bound": l.bound, "bound_unit": l.bound_unit,
             "original_bytes": l.original_bytes, "data_bytes": l.data_bytes, "index_bytes": l.index_bytes,
             "stream_bytes": l.stream_bytes, "ratio": l.ratio, "measured_loss_alone": l.loss}
            for l in result.layers
        ],
        "totals": {
            "fc_original_bytes": result.fc_original_bytes, "fc_compressed_bytes": result.fc_compressed_bytes,
            "ratio": result.ratio, "model_bytes": result.model_bytes, "dsz_bytes": len(result.dsz),
            "file_ratio": result.file_ratio, "measured_loss": result.loss, "max_loss": result.max_loss,
            "samples": result.samples, "fast_evaluation": result.fast_evaluation, "device": result.device,
            "cpu_reason": result.cpu_reason, "evaluations": result.evaluations,
            "evaluations_per_second": result.evaluations_per_second, "compensated": result.compensated,
            "held_out_loss": result.held_out_loss,
            "constants_rel": result.constants_rel,
        },
        "assessment": {"layers": result.assessment, "below_floor": result.below_floor},
        "warnings": result.warnings,
        "verification": result.attempts,
        "curves": {name: [p.as_dict() for p in points] for name, points in result.curves.items()},
    }
    if extra:
        out.update(extra)
    return out


def _loss(result: Result, loss: float) -> str:
    """A mean loss as people read it: points for discrete metrics, the value itself otherwise."""
    return f"{100 * loss:+.2f}" if result.metric.discrete else f"{loss:.3g}"


def _value(result: Result, value: float) -> str:
    return f"{100 * value:.2f}%" if result.metric.discrete else f"{value:.4g}"


def _bound(layer) -> str:
    """A layer's bound as `dsz pack -e` takes it: a value, or steps ("2q") of an int8/uint8 layer."""
    if layer.bound == 0:
        return "lossless"
    return f"{layer.bound:g}q" if layer.bound_unit == "steps" else f"{layer.bound:.3g}"


def layer_table(result: Result) -> str:
    """Per layer: shape, density, bound, data bytes, index bytes, ratio, measured loss (alone)."""
    unit = "points" if result.metric.discrete else result.metric.name
    rows = [[l.name, "x".join(map(str, l.shape)), f"{l.density:.3f}", _bound(l),
             l.data_bytes, l.index_bytes, f"{l.ratio:.1f}x", _loss(result, l.loss)] for l in result.layers]
    return format_table(["layer", "shape", "density", "bound", "data B", "index B", "ratio", f"loss ({unit})"], rows)


def totals_line(result: Result) -> str:
    """The paper's totals: layers' size before and after, ratio, the metric before and after."""
    m = result.metric
    unit = "points" if m.discrete else m.unit
    return (f"compressed layers: {result.fc_original_bytes / 1024:.1f} KB -> {result.fc_compressed_bytes / 1024:.1f} KB "
            f"({result.ratio:.1f}x; whole file {result.model_bytes} -> {len(result.dsz)} bytes, "
            f"{result.file_ratio:.1f}x); {m.spec} {_value(result, result.before)} -> {_value(result, result.after)} "
            f"(measured loss {_loss(result, result.loss)}, allowed {_loss(result, result.allowed_loss)} {unit}; "
            f"{result.samples} samples, {result.evaluations_per_second:.1f} evaluations/s)" + _decided(result))


def _decided(result: Result) -> str:
    """Where the decisions measured in another metric: what it says of the file, and that the labels checked it."""
    d = result.decided
    if not d:
        return ""
    return f"; decided in {d['metric']}, {result.margin:g} sd in hand: {_loss(result, d['loss'])} of {_loss(result, d['allowed'])}"


def assessment_line(result: Result) -> str:
    """How the layers were assessed (pydsz.assess.plan): alone, as a group (estimated bounds), left out by the
    size floor; the evaluations and their seconds."""
    plans: dict = {}
    for name, info in result.assessment.items():
        plans.setdefault(info["plan"], []).append(name)
    parts = [f"{len(plans[k])} measured alone ({k})" for k in ("fitted", "ladder") if k in plans]
    if "group" in plans:
        group = plans["group"]
        parts.append(f"{len(group)} as one group, their bounds estimated from its loss ({', '.join(group[:6])}"
                     + (", ..." if len(group) > 6 else "") + ")")
    if result.below_floor:
        parts.append(f"{len(result.below_floor)} under --min-layer-bytes kept lossless")
    if result.compensated:
        held_out = "" if result.held_out_loss is None else (
            f", cross-fitted (held-out loss {_loss(result, result.held_out_loss)})")
        parts.append(f"{len(result.compensated)} compensated{held_out}")
    if result.constants_rel:
        parts.append(f"biases and other constants gathered, each within {result.constants_rel:.3g} of its largest value")
    return f"assessment: {'; '.join(parts)}; {result.evaluations} evaluations in {result.evaluation_seconds:.0f} s"


def plot_curves(result: Result) -> bytes:
    """Each layer's loss vs error bound with the chosen bound marked, as PNG bytes."""
    import io

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(result.curves)
    fig, axes = plt.subplots(1, len(names), figsize=(4.2 * len(names), 3.4), squeeze=False)
    chosen = {l.name: l.bound for l in result.layers}
    scale = (100 if result.metric.discrete else 1) / result.samples  # summed losses -> points or the unit
    budget = result.allowed * scale
    for ax, name in zip(axes[0], names):
        points = [p for p in result.curves[name] if p.bound > 0]
        ax.plot([p.bound for p in points], [p.loss * scale for p in points], "o-", ms=3, label="measured, alone")
        expected = expected_losses(result.curves[name], result.margin)[-len(points):] if points else []
        ax.plot([p.bound for p in points], [e * scale for e in expected], "-", lw=1, color="orange",
                label=f"as optimized (+{result.margin:g} sd, monotone)")
        pick = next((p for p in points if p.bound == chosen.get(name)), None)
        if pick is not None:
            ax.plot([pick.bound], [pick.loss * scale], "r*", ms=12, label=f"chosen {pick.bound:.3g}")
        ax.axhline(budget, color="gray", ls="--", lw=1, label="budget")
        ax.set_xscale("log")
        ax.set_title(name)
        ax.set_xlabel("absolute error bound")
        ax.set_ylabel(f"{result.metric.name} loss" + (" (points)" if result.metric.discrete else ""))
        ax.legend(fontsize=7)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    return buf.getvalue()


def write_report(result: Result, directory, extra: Optional[dict] = None) -> list[Path]:
    """report.json and curves.png in `directory` (created if needed), both or neither; their paths."""
    return write_files(directory, {"report.json": json.dumps(to_dict(result, extra), indent=2).encode(),
                                   "curves.png": plot_curves(result)})
