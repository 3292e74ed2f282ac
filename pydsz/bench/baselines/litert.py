"""The LiteRT Quantizer (`litert-quantizer` on PyPI, Google's post-training tool) as a baseline.

Each recipe quantizes the model as a user would (`Quantizer(model, recipe).quantize()`); the
quantized .tflite is then judged like every other method's file. The tool is optional
(`pip install 'pydsz[quantizer]'`); where it is missing, refuses the model or quantizes no weight,
the outcome says so instead of a size, and the bench goes on.
"""

from __future__ import annotations

import contextlib
import io
import logging
from dataclasses import dataclass
from typing import Optional

# what a user reaches for: weight-only and dynamic-range int8, dynamic int4 per channel, and one
# blockwise recipe (blocks of 32 along the input axis)
RECIPES = ("weight_only_wi8_afp32", "dynamic_wi8_afp32", "dynamic_wi4_afp32", "dynamic_wi4b32_afp32")


@dataclass(frozen=True)
class Outcome:
    """One recipe on one model: the quantized file, or why there is none."""

    recipe: str
    tflite: Optional[bytes]  # None: see `note`
    quantized: int  # layers whose weights the recipe turned into integers
    layers: int  # layers (FULLY_CONNECTED and convolutions) of the model
    note: str = ""


def available() -> Optional[str]:
    """None when litert-quantizer imports, else why not (one line)."""
    try:
        import litert_quantizer  # noqa: F401
    except ImportError as exc:
        return f"litert-quantizer is not installed (pip install 'pydsz[quantizer]'): {exc}"
    return None


def _integer_layers(tflite: bytes) -> tuple[int, int]:
    """(layers whose weight is stored as an integer type, all layers) of a .tflite."""
    from pydsz.model.graph import TFLiteModel

    model = TFLiteModel(tflite)
    layers = model.layers(("fc", "conv"))
    integer = 0
    for layer in layers:
        # weight-only recipes put a DEQUANTIZE before the op: the stored constant is the integer one
        stored = model.tensors[layer.stored] if layer.stored >= 0 else model.tensors[layer.weight]
        producer = [op for op in model.ops if layer.weight in op.outputs]
        if stored.type.startswith("INT") or stored.type.startswith("UINT") or any(
                model.tensors[i].type.startswith("INT") for op in producer for i in op.inputs if i >= 0):
            integer += 1
    return integer, len(layers)


def quantize(tflite: bytes, recipe: str) -> Outcome:
    """The model quantized by one of RECIPES (or any recipe function the package names)."""
    from pydsz.model.graph import TFLiteModel

    layers = len(TFLiteModel(tflite).layers(("fc", "conv")))
    missing = available()
    if missing:
        return Outcome(recipe, None, 0, layers, missing)
    from litert_quantizer import quantizer
    from litert_quantizer import recipe as recipes

    if not hasattr(recipes, recipe):
        return Outcome(recipe, None, 0, layers, f"litert-quantizer has no recipe {recipe}")
    try:
        # the tool logs and prints a report per call; the bench prints its own table
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            logging.getLogger("absl").setLevel(logging.ERROR)
            result = quantizer.Quantizer(bytearray(tflite), getattr(recipes, recipe)()).quantize(
                enable_progress_report=False)
        out = bytes(result.quantized_model)
    except Exception as exc:  # the tool's own errors: reported in the table, never fatal
        return Outcome(recipe, None, 0, layers, f"refused: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}")
    try:
        integer, layers = _integer_layers(out)
    except Exception as exc:  # a type pydsz's reader does not know (INT4): still a file to judge
        return Outcome(recipe, out, -1, layers, f"its layers could not be counted ({exc})")
    note = ""
    if not integer:
        note = "quantizes no layer: the file is the float model"
        if _deprecated_codes(tflite):
            note += ("; its operator codes are in the deprecated field (an older converter's), which "
                     "litert-quantizer does not read: it takes every op for ADD")
    return Outcome(recipe, out, integer, layers, note)


def _deprecated_codes(tflite: bytes) -> bool:
    """Whether some operator code is only in `deprecated_builtin_code` (builtin_code left 0, ADD), as
    converters before the schema's 127-operator extension wrote them."""
    import tflite as schema

    model = schema.Model.GetRootAsModel(tflite, 0)
    for i in range(model.OperatorCodesLength()):
        code = model.OperatorCodes(i)
        # field 4 of OperatorCode (vtable offset 10): absent reads as 0; the tflite package's
        # BuiltinCode() then answers with the deprecated field, which hides the absence
        if code._tab.Offset(10) == 0 and code.DeprecatedBuiltinCode() != 0:
            return True
    return False
