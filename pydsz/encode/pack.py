"""Writing the .dsz model container (pydsz.format.container reads it; doc/format.md): each compressed
tensor's stream and its place in the model, the rest of the model's bytes kept with zstd.
"""
from __future__ import annotations

import math
import struct
from typing import Mapping, Union

import numpy as np
import zstandard

from pydsz.encode import gather
from pydsz.errors import InputError
from pydsz.format import codec
from pydsz.format.container import (
    CRC,
    DTYPES,
    ENTRY,
    HEADER,
    LZMA_REST_MAX,
    MAGIC,
    REPRESENTATIONS,
    REST_LZMA,
    TABLE_LZMA,
    DszModel,
    TensorEntry,
    crc,
    kept,
)
from pydsz.format.files import read_file, write_atomic
from pydsz.format.spans import spans_bytes
from pydsz.format.wrapping import lzma_tables
from pydsz.model.selection import KINDS

DTYPE_CODES = {v: k for k, v in DTYPES.items()}

_ZSTD_LEVEL = 19


_ZSTD_WINDOW_LOG = 18


# a bound is an absolute value (float layers) or a number of quantization steps, written "2q"
# (int8/uint8 layers); one bound for every layer, or a mapping from layer name to bound, where the
# key OTHERS gives the layers not named one bound as one bound for all does
Bound = Union[float, str]


Bounds = Union[Bound, Mapping[str, Bound]]


OTHERS = "*"


def _encode_tensor(w: np.ndarray, bound: float) -> tuple[str, bytes]:
    """The smaller of the sparse (pruned) and dense representations of a weight tensor, in its
    stored dtype (the bound holds after the rounding to it)."""
    # conv kernels (OHWI) are coded as [O, H*W*I] matrices: the same bytes in the same order
    matrix = w.reshape(w.shape[0] if w.ndim else 1, -1)
    candidates = [("sparse", codec.encode_sparse(matrix, bound))]
    # a dense stream can only pay off for a tensor that was not pruned
    if np.count_nonzero(w) > w.size // 2:
        candidates.append(("dense", codec.compress_array(w, bound)))
    return min(candidates, key=lambda c: len(c[1]))


def parse_bound(value: Bound, what: str) -> tuple[float, bool]:
    """(value, in steps?) of a bound: a number (absolute) or "<k>q" (k quantization steps)."""
    if isinstance(value, str) and value.strip().lower().endswith("q"):
        text = value.strip()[:-1]
        if not text.isdigit() or int(text) > codec.MAX_STEPS:
            raise InputError(f"{what}: bound {value!r} must be a whole number of steps 0..{codec.MAX_STEPS} "
                             "followed by q (2q)")
        return float(int(text)), True
    try:
        bound = float(value)
    except (TypeError, ValueError):
        raise InputError(f"{what}: bound {value!r} is neither a number nor a number of steps (2q)") from None
    if not math.isfinite(bound) or bound < 0:
        raise InputError(f"{what}: error bound {bound} must be a finite number >= 0")
    return bound, False


def _integer(layer) -> bool:
    return layer.stored_dtype in ("INT8", "UINT8")


def _resolve_bounds(layers, error_bounds: Bounds) -> dict[str, float]:
    """Bound per compressible layer name: absolute for float layers, in steps for int8/uint8 ones.

    A bound of 0 keeps a layer lossless (an integer layer is then entropy-coded losslessly where that
    beats the zstd of the rest). One bound for all applies to the layers of its kind (a number to
    float layers, steps to integer ones), and so does a mapping's OTHERS to the layers it does not
    name; the others, like layers absent from a mapping without OTHERS, get 0.
    """
    compressible = [layer for layer in layers if layer.compressible]
    names = [layer.name for layer in compressible]
    if not isinstance(error_bounds, Mapping):
        error_bounds = {OTHERS: error_bounds}
    reasons = {layer.name: layer.skip_reason for layer in layers if not layer.compressible}
    for name in error_bounds:
        if name in reasons:
            raise InputError(f"layer {name} cannot be compressed: {reasons[name]}")
    unknown = sorted(set(error_bounds) - set(names) - {OTHERS})
    if unknown:
        raise InputError(
            f"no compressible layer named {', '.join(unknown)}; the model has {', '.join(names) or 'none'}"
        )
    given = {name: parse_bound(value, "all layers" if name == OTHERS and len(error_bounds) == 1 else
                               "the other layers" if name == OTHERS else f"layer {name}")
             for name, value in error_bounds.items()}
    others_value, others_steps = given.pop(OTHERS, (0.0, None))
    bounds = {}
    for layer in compressible:
        if layer.name not in given:
            # like one bound for all: it applies to the layers of its kind, the others stay lossless
            bounds[layer.name] = others_value if others_steps == _integer(layer) else 0.0
            continue
        value, steps = given[layer.name]
        if value and steps != _integer(layer):
            raise InputError(f"layer {layer.name} stores {layer.stored_dtype.lower()} weights: give its bound "
                             + ("in quantization steps (2q)" if _integer(layer) else "as a number (0.005)"))
        bounds[layer.name] = value
    return bounds


def bound_warnings(tflite_bytes: bytes, error_bounds: Bounds, layers: str = "fc") -> list[str]:
    """One line per way the bounds likely do not do what was meant: a bound for all given in the unit
    of no layer of the model (steps where every weight is float, a number where every one is an
    integer), which keeps every layer lossless; a bound at or above every weight's magnitude, under
    which the layer decodes to zeros."""
    from pydsz.model.graph import TFLiteModel

    model = TFLiteModel(bytes(tflite_bytes))
    found = _layers(model, layers)
    compressible = [layer for layer in found if layer.compressible]
    out = []
    default = error_bounds.get(OTHERS) if isinstance(error_bounds, Mapping) else error_bounds
    if default is not None and compressible:
        value, steps = parse_bound(default, "the bound for all layers")
        if value and not any(_integer(layer) == steps for layer in compressible):
            out.append(f"bound {default} is " + ("a number of quantization steps, for int8/uint8 layers; this model's "
                       "are float: each is kept lossless (give a number such as 0.005)" if steps else
                       "a number, for float layers; this model's are int8/uint8: each is kept lossless (give "
                       "quantization steps such as 2q)"))
    bounds = _resolve_bounds(found, error_bounds)
    zeroed = [layer.name for layer in compressible if not _integer(layer) and bounds[layer.name] > 0
              and bounds[layer.name] >= float(np.max(np.abs(model.weight(layer)), initial=0.0))]
    if zeroed:
        out.append(f"the bound is at or above every weight's magnitude in {', '.join(zeroed)}: "
                   f"{'it decodes' if len(zeroed) == 1 else 'they decode'} to zeros")
    return out


def stored_bounds(model, bounds: Mapping[str, float]) -> dict[str, Bound]:
    """pack_model's bounds for per-layer numbers as assessment measures them: absolute for float
    layers, whole steps for int8/uint8 ones (written "<k>q")."""
    return {name: f"{int(b)}q" if _integer(model.layer(name)) else b for name, b in bounds.items()}


def _layers(model, layers: str) -> list:
    kinds = KINDS.get(layers)
    if kinds is None:
        raise InputError(f"layers must be fc, conv or all, not {layers!r}")
    return model.layers(kinds=kinds)


def kept_lossless(tflite_bytes: bytes, layers: str = "fc") -> dict[str, str]:
    """The chosen kind's layers whose weights cannot be compressed (int8, float16, ...), with why."""
    from pydsz.model.graph import TFLiteModel

    return {layer.name: layer.skip_reason for layer in _layers(TFLiteModel(bytes(tflite_bytes)), layers)
            if not layer.compressible}


def pack_model(tflite_bytes: bytes, error_bounds: Bounds, layers: str = "fc", *, gather_small: bool = False,
               constants_rel: float = 0.0) -> bytes:
    """Compress a .tflite model into .dsz bytes.

    error_bounds: one bound for every compressible weight tensor of the chosen layers, or a mapping
    from layer name (fc1, fc2, conv1, ...) to bound; a bound is absolute (0.005) for float32 and
    float16 weights and a number of quantization steps ("2q") for int8/uint8 ones; a bound of 0
    keeps a layer lossless (_resolve_bounds).
    layers: "fc", "conv" or "all". float16 weights (behind a DEQUANTIZE op) are compressed in
    float16: every decoded value is within the bound of the stored one. Weights that cannot be
    compressed (quantized, computed at run time) stay in the lossless rest of the model;
    kept_lossless() says which and why.
    gather_small: small float kernels share streams where that is smaller (pydsz.encode.gather; the file is
    then format version 3), each within its own bound.
    constants_rel: a relative bound for the model's small float constants (the layers' biases; with
    layers "all" also PReLU slopes and ADD/SUB/MUL operands: pydsz.encode.constants), each within this
    fraction of its largest magnitude, gathered too; 0 keeps them in the lossless rest.
    """
    return assemble(*encode_tensors(tflite_bytes, error_bounds, layers), layers, gather_small=gather_small,
                    constants_rel=constants_rel)


def encode_tensors(tflite_bytes: bytes, error_bounds: Bounds, layers: str = "fc") -> tuple:
    """pack_model's encoding: (the parsed model, an entry per compressed weight buffer). assemble() then
    writes the file, as often as the main job tries its constants, without encoding the weights again."""
    from pydsz.model.graph import TFLiteModel  # the flatbuffer reader is only needed to encode

    data = bytes(tflite_bytes)
    model = TFLiteModel(data)
    found = _layers(model, layers)
    compressible = [layer for layer in found if layer.compressible]
    bounds = _resolve_bounds(found, error_bounds)

    # a buffer shared by several ops is compressed once, under the tightest bound asked of it
    by_buffer: dict[int, list] = {}
    for layer in compressible:
        if bounds[layer.name] > 0 or _integer(layer):
            by_buffer.setdefault(layer.buffer_index, []).append(layer)

    entries = []
    for buffer_index, group in by_buffer.items():
        layer = group[0]
        bound = min(bounds[g.name] for g in group)
        w = model.stored(layer)
        representation, stream = _encode_tensor(w, bound)
        if bound == 0 and len(stream) >= lossless_size(np.ascontiguousarray(w)):
            continue  # lossless entropy coding of integers that does not beat the zstd of the rest
        entries.append(TensorEntry(
            name=",".join(g.name for g in group), buffer_index=buffer_index, offset=layer.offset,
            nbytes=layer.nbytes, shape=tuple(w.shape), representation=representation,
            error_bound=bound, stream=stream, dtype=w.dtype.name,
        ))
    return model, entries


def assemble(model, entries: list, layers: str = "fc", *, gather_small: bool = False,
             constants_rel: float = 0.0) -> bytes:
    """The .dsz bytes of encode_tensors' model and entries, gathered as pack_model says."""
    if gather_small or constants_rel > 0:
        entries = _gathered(model, entries, gather_small, constants_rel, KINDS[layers])
    return _serialize(model.data, entries)


def _gathered(model, entries: list, kernels: bool, rel: float, kinds: tuple) -> list[TensorEntry]:
    """`entries` with the model's constants within `rel` of their magnitudes and, if `kernels`, the small
    float kernels whose own streams cost more, gathered (pydsz.encode.gather)."""
    candidates = [gather.Part(f"{e.name}:{'x'.join(map(str, e.shape))}", e.offset,
                              np.asarray(model.stored(model.layer(e.name))).reshape(-1), e.error_bound,
                              len(e.stream) + ENTRY.size + 8 * len(e.shape) + len(e.name))
                  for e in entries if kernels and e.dtype in ("float32", "float16") and e.error_bound > 0
                  and "," not in e.name]
    groups = gather.groups(model, candidates, rel, kinds, lossless_size)
    joined = {name.split(":")[0] for g in groups for name in g.names if name}
    return [e for e in entries if e.name not in joined] + [
        TensorEntry(name=",".join(g.names), buffer_index=0, offset=g.spans[0][0],
                    nbytes=g.n * np.dtype(g.dtype).itemsize, shape=(g.n,), representation="gathered",
                    error_bound=g.bound, stream=g.stream, dtype=g.dtype, spans=g.spans)
        for g in groups]


def _rest(data: bytes, holes: list) -> np.ndarray:
    """The model's bytes with the (start, end) holes zeroed, the compressed tensors' places. A new
    zero array's pages are the kernel's zero page until written and only the bytes around the holes
    are copied, so the rest of an FC-heavy model takes a fraction of its size (VGG-16: not 457 MiB)."""
    rest = np.zeros(len(data), np.uint8)
    source = np.frombuffer(data, np.uint8)
    for a, b in kept(len(data), holes):
        rest[a:b] = source[a:b]
    return rest


def _rest_compressor(checksum: bool) -> zstandard.ZstdCompressor:
    # a 256 KiB window: the rest is zero runs and metadata, which gain nothing from a longer one (the
    # bundled models' rest grows by 0.02%), and the streaming decoder then works in cache and
    # allocates 256 KiB where level 19's own choice is up to 8 MiB (AlexNet's FC: 8 MiB, 25% slower)
    params = zstandard.ZstdCompressionParameters.from_level(_ZSTD_LEVEL, window_log=_ZSTD_WINDOW_LOG,
                                                            write_checksum=checksum)
    return zstandard.ZstdCompressor(compression_params=params)


def lossless_size(data) -> int:
    """The bytes `data` (a buffer) takes when kept lossless in the model's zstd section: its size
    compressed alone with that section's parameters. Within the section, where the window holds
    only 256 KiB of what came before, a large tensor's share differs from this by ~0.1%."""
    return len(_rest_compressor(checksum=False).compress(data))


def _wrap_rest(data: bytes, holes: list) -> tuple[int, bytes]:
    """The model's bytes but the compressed tensors' (holes) as the container's rest: zstd of them all,
    the holes zeroed, or (the header's REST_LZMA) raw LZMA2 of the bytes outside the holes, back to
    back, where that is at least a hundredth smaller (bench/container_lzma.py: on every zoo model
    measured, the rest 8-25% smaller, and decoded as fast or faster where it is a graph and zero
    runs; where it holds lossless weights a few ms slower: lenet5's convolutions 7.5 ms against 2.2,
    for 3% fewer bytes)."""
    zstd = _rest_compressor(checksum=True).compress(_rest(data, holes))
    if len(data) > LZMA_REST_MAX:
        return 0, zstd
    packed = lzma_tables(b"".join(data[a:b] for a, b in kept(len(data), holes)))
    return (REST_LZMA, packed) if len(packed) < 0.99 * len(zstd) else (0, zstd)


def _serialize(data: bytes, entries: list[TensorEntry]) -> bytes:
    model_bytes = len(data)
    flags, rest_z = _wrap_rest(data, [hole for e in entries for hole in e.holes])
    table = bytearray()
    for e in entries:
        name = e.name.encode()
        rep = {v: k for k, v in REPRESENTATIONS.items()}[e.representation]
        table += ENTRY.pack(e.offset, e.nbytes, e.buffer_index, rep, DTYPE_CODES[e.dtype], len(e.shape), 0,
                             e.error_bound, len(e.stream), len(name))
        table += struct.pack(f"<{len(e.shape)}Q", *e.shape) + name
        if e.representation == "gathered":
            table += spans_bytes(e.spans)
    # names, shapes and spans: 8% of hand_recrop's .dsz raw, 3.4% as LZMA2
    packed = struct.pack("<I", len(table)) + lzma_tables(bytes(table))
    if len(packed) < len(table):
        flags, table = flags | TABLE_LZMA, packed
    streams = b"".join(e.stream for e in entries)
    version = 4 if flags else 3 if any(e.spans for e in entries) else 1 if all(e.dtype == "float32" for e in entries) \
        else 2
    head = HEADER.pack(MAGIC, version, flags, len(entries), len(table), model_bytes, len(rest_z), len(streams)) \
        + bytes(table)
    body = head + CRC.pack(crc(head)) + rest_z + streams
    return body + CRC.pack(crc(body))


def holding(model: bytes, entries: list) -> bytes:
    """A .dsz that decodes to exactly `model`: the update entries coded afresh (pydsz.format.update;
    their streams decode to the values in place) keep their streams, everything else goes lossless
    into the rest. What dsz patch -o NAME.dsz writes: the device keeps a .dsz whose decoded bytes are
    the patched model's, the base of the next update."""
    kept = [TensorEntry(name=e.name, buffer_index=0, offset=e.offset, nbytes=e.nbytes, shape=e.shape,
                        representation=e.kind, error_bound=e.bound, stream=e.stream, dtype=e.dtype)
            for e in entries if e.kind in ("dense", "sparse")]
    return _serialize(model, kept)


def write_model(tflite_path, dsz_path, error_bounds: Bounds, layers: str = "fc") -> DszModel:
    """Compress the .tflite at tflite_path into dsz_path; returns the written model, opened."""
    packed = pack_model(read_file(tflite_path), error_bounds, layers=layers)
    write_atomic(dsz_path, packed)
    return DszModel(packed)
