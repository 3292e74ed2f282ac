"""Which layers a command compresses: by kind (fc, conv, all), by name (fc3, conv12,conv13), and above
a size floor.

A layer of fewer bytes than the floor (--min-layer-bytes) is left out, kept lossless in the
container's zstd section: its codec stream's own headers take about as much as any error bound can
save (a 32-byte layer's stream is 41 bytes), and every layer assessed costs evaluations. A layer
named explicitly is kept whatever its size.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Union

from pydsz.errors import InputError

if TYPE_CHECKING:  # the command line reads this module's defaults where the tflite parser is absent
    from pydsz.model.graph import TFLiteModel

KINDS = {"fc": ("fc",), "conv": ("conv",), "all": ("fc", "conv")}
# the default floor: below it a stream's headers eat the saving (bench/engine.py's models: every layer
# under 256 bytes was kept lossless by the full assessment, or saved under 20 bytes)
MIN_LAYER_BYTES = 256


@dataclass(frozen=True)
class Selection:
    """Which layers a command compresses: `spec` (fc, conv, all, or layer names: parse), the layers
    chosen by kind from `min_bytes` on (named ones whatever their size)."""

    spec: str = "fc"
    min_bytes: int = MIN_LAYER_BYTES

    @classmethod
    def of(cls, layers: Union[str, "Selection"]) -> "Selection":
        """A Selection as given, or a spec's with the default floor."""
        return layers if isinstance(layers, Selection) else cls(layers)


def parse(spec: str) -> tuple[tuple, tuple]:
    """--layers as (kinds, names): "fc", "conv", "all", layer names ("fc3", "conv12,conv13"), or both."""
    kinds, names = [], []
    for item in (part.strip() for part in str(spec).split(",")):
        if not item:
            raise InputError(f"--layers {spec!r}: an empty item; give fc, conv, all or layer names such as fc3")
        if item in KINDS:
            kinds.extend(k for k in KINDS[item] if k not in kinds)
        elif item not in names:
            names.append(item)
    return tuple(kinds), tuple(names)


def container_kind(spec: str) -> str:
    """The kind the container packs for a selection: the one kind given, else "all" (its bounds then
    name the layers chosen, every other layer stays lossless)."""
    return spec if spec in KINDS else "all"


def _summary(layers: list) -> str:
    """Layers as people read a long list: fc1, fc2, conv1..conv77 (runs of three or more collapsed)."""
    runs: list = []
    for layer in layers:
        kind, number = layer.name.rstrip("0123456789"), layer.name[len(layer.name.rstrip("0123456789")):]
        if runs and runs[-1][0] == kind and number.isdigit() and runs[-1][2] + 1 == int(number):
            runs[-1][2] = int(number)
        else:
            runs.append([kind, int(number) if number.isdigit() else 0, int(number) if number.isdigit() else 0,
                         layer.name])
    parts = []
    for kind, first, last, name in runs:
        if last - first >= 2:
            parts.append(f"{kind}{first}..{kind}{last}")
        else:
            parts.extend(name if first == last else f"{kind}{k}" for k in range(first, last + 1))
    return ", ".join(parts)


def compressible_layers(model: TFLiteModel, layers: str = "fc", min_bytes: int = 0) -> list:
    """The compressible layers of a selection (parse's: kinds and names), those chosen by kind only
    from min_bytes on; InputError if none, saying which layers the model has and how to choose them.
    A buffer shared by several layers is assessed once, under its first layer's name."""
    kinds, names = parse(layers)
    every = model.layers(("fc", "conv"))
    compressible = [layer for layer in every if layer.compressible]
    by_name = {layer.name: layer for layer in every}
    for name in names:
        if name not in by_name:
            raise InputError(f"--layers {layers}: the model has no layer {name!r}; its compressible layers are "
                             f"{_summary(compressible) or 'none'}")
        if not by_name[name].compressible:
            raise InputError(f"--layers {layers}: layer {name} cannot be compressed: {by_name[name].skip_reason}")
    by_kind = [layer for layer in compressible if layer.kind in kinds]
    found = [layer for layer in compressible if layer.name in names
             or (layer in by_kind and layer.nbytes >= min_bytes)]
    if not found:
        raise InputError(_none_found(model, layers, kinds, by_kind, compressible, min_bytes))
    seen, unique = set(), []
    for layer in found:
        if layer.buffer not in seen:
            seen.add(layer.buffer)
            unique.append(layer)
    return unique


def below_floor(model: TFLiteModel, layers: str, min_bytes: int) -> list:
    """The compressible layers a selection's kinds hold that the floor leaves out, by name."""
    kinds, names = parse(layers)
    return [layer.name for layer in model.layers(kinds) if layer.compressible and layer.name not in names
            and layer.nbytes < min_bytes]


def _none_found(model, layers, kinds, by_kind, compressible, min_bytes) -> str:
    kind = "/".join(kinds)
    if by_kind:
        return (f"all {len(by_kind)} compressible {kind} layers are smaller than --min-layer-bytes {min_bytes} "
                f"(the largest, {max(by_kind, key=lambda l: l.nbytes).name}, holds "
                f"{max(l.nbytes for l in by_kind)} bytes): lower it, or name layers with --layers")
    skipped = [f"{l.name} ({l.skip_reason})" for l in model.layers(kinds)]
    text = f"the model has no compressible {kind} layer" + (f": {', '.join(skipped)}" if skipped else "")
    if compressible:
        total = sum(l.nbytes for l in compressible)
        others = sorted({l.kind for l in compressible})
        text += (f"; its compressible layers are {_summary(compressible)} ({total / 1024:.0f} KiB): choose them "
                 f"with --layers {'all' if len(others) > 1 else others[0]}, or by name (--layers "
                 f"{','.join(l.name for l in sorted(compressible, key=lambda l: -l.nbytes)[:2])})")
    return text
