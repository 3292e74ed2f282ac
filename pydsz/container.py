"""The .dsz model container: a whole .tflite model with its weight tensors error-bounded compressed.

The model's bytes, with every compressed tensor's bytes zeroed, are kept losslessly with zstd (the
zero runs cost next to nothing); a table says where each compressed tensor lives in the model file
and holds the codec stream that rebuilds it. Decoding needs no flatbuffer parser: inflate the rest,
then decode every tensor into its place. doc/format.md specifies the bytes.
"""
from __future__ import annotations

import math
import os
import struct
import tempfile
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Union

import numpy as np
import zstandard

from . import _core, codec, gather
from .selection import KINDS
from .errors import DszError, FormatError, InputError

MAGIC = b"DSZM"
# newest container version; a file is written with the oldest version that holds it: 1 when every
# compressed tensor is float32 (readers from before stored dtypes keep reading such files), 2 when
# one is float16, int8 or uint8 (those readers then refuse the file, naming the version), 3 when it
# holds a gathered entry (several small tensors decoded from one stream: pydsz.gather)
FORMAT_VERSION = 3
# magic, version, flags, n_tensors, table bytes, model bytes, rest bytes, streams bytes
_HEADER = struct.Struct("<4sHHIIQQQ")
# offset, nbytes, buffer index, representation, dtype, ndim, reserved, bound, stream bytes, name bytes
_ENTRY = struct.Struct("<QQIBBBBdQH")
_CRC = struct.Struct("<I")
_MAX_NDIM = 8
_REPRESENTATIONS = {0: "dense", 1: "sparse", 2: "gathered"}
# the table's dtype codes: the dtype a tensor is stored in, in the model and in its stream
DTYPES = {0: "float32", 1: "float16", 2: "int8", 3: "uint8"}
_DTYPE_CODES = {v: k for k, v in DTYPES.items()}
_ZSTD_LEVEL = 19
_ZSTD_WINDOW_LOG = 18
# a zstd block inflates to at most 128 KiB and takes at least 4 bytes (an RLE block)
_ZSTD_MAX_RATIO = 32768
_INFLATE_CHUNK = 1 << 18  # bytes inflated at a time: small enough to stay in the CPU's cache

# a bound is an absolute value (float layers) or a number of quantization steps, written "2q"
# (int8/uint8 layers); one bound for every layer, or a mapping from layer name to bound, where the
# key OTHERS gives the layers not named one bound as one bound for all does
Bound = Union[float, str]
Bounds = Union[Bound, Mapping[str, Bound]]
OTHERS = "*"


@dataclass(frozen=True)
class TensorEntry:
    """One compressed tensor: where its bytes go in the model file and the stream that rebuilds them."""

    name: str
    buffer_index: int
    offset: int
    nbytes: int
    shape: tuple
    representation: str
    error_bound: float  # absolute; whole quantization steps for int8 and uint8
    stream: bytes
    dtype: str = "float32"  # the stored dtype (DTYPES)
    # "gathered": the stream's values, in order, fill these (offset, count, step) places of the model
    # (pydsz.gather); the entry's offset is the first one's and nbytes their total
    spans: tuple = ()

    @property
    def itemsize(self) -> int:
        return np.dtype(self.dtype).itemsize

    @property
    def holes(self) -> list:
        """The (start, end) byte ranges of the model that this entry's values fill."""
        if self.representation == "gathered":
            return [(offset, offset + count * self.itemsize) for offset, count, _ in self.spans]
        return [(self.offset, self.offset + self.nbytes)]


def _crc(data) -> int:
    return zlib.crc32(data) & 0xFFFFFFFF


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
    from .model import TFLiteModel

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
    gather_small: small float kernels share streams where that is smaller (pydsz.gather; the file is
    then format version 3), each within its own bound.
    constants_rel: a relative bound for the model's small float constants (the layers' biases; with
    layers "all" also PReLU slopes and ADD/SUB/MUL operands: pydsz.constants), each within this
    fraction of its largest magnitude, gathered too; 0 keeps them in the lossless rest.
    """
    return assemble(*encode_tensors(tflite_bytes, error_bounds, layers), layers, gather_small=gather_small,
                    constants_rel=constants_rel)


def encode_tensors(tflite_bytes: bytes, error_bounds: Bounds, layers: str = "fc") -> tuple:
    """pack_model's encoding: (the parsed model, an entry per compressed weight buffer). assemble() then
    writes the file, as often as the main job tries its constants, without encoding the weights again."""
    from .model import TFLiteModel  # the flatbuffer reader is only needed to encode

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
    return _serialize(len(model.data), _rest(model.data, [hole for e in entries for hole in e.holes]), entries)


def _gathered(model, entries: list, kernels: bool, rel: float, kinds: tuple) -> list[TensorEntry]:
    """`entries` with the model's constants within `rel` of their magnitudes and, if `kernels`, the small
    float kernels whose own streams cost more, gathered (pydsz.gather)."""
    candidates = [gather.Part(f"{e.name}:{'x'.join(map(str, e.shape))}", e.offset,
                              np.asarray(model.stored(model.layer(e.name))).reshape(-1), e.error_bound,
                              len(e.stream) + _ENTRY.size + 8 * len(e.shape) + len(e.name))
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
    at = 0
    for start, end in sorted(holes):
        rest[at:start] = source[at:start]
        at = max(at, end)
    rest[at:] = source[at:]
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


def _serialize(model_bytes: int, rest, entries: list[TensorEntry]) -> bytes:
    rest_z = _rest_compressor(checksum=True).compress(rest)
    table = bytearray()
    for e in entries:
        name = e.name.encode()
        rep = {v: k for k, v in _REPRESENTATIONS.items()}[e.representation]
        table += _ENTRY.pack(e.offset, e.nbytes, e.buffer_index, rep, _DTYPE_CODES[e.dtype], len(e.shape), 0,
                             e.error_bound, len(e.stream), len(name))
        table += struct.pack(f"<{len(e.shape)}Q", *e.shape) + name
        if e.representation == "gathered":
            table += gather.spans_bytes(e.spans)
    streams = b"".join(e.stream for e in entries)
    version = 3 if any(e.spans for e in entries) else 1 if all(e.dtype == "float32" for e in entries) else 2
    head = _HEADER.pack(MAGIC, version, 0, len(entries), len(table), model_bytes, len(rest_z), len(streams)) \
        + bytes(table)
    body = head + _CRC.pack(_crc(head)) + rest_z + streams
    return body + _CRC.pack(_crc(body))


class _Reader:
    """Bounds-checked little-endian reads from an untrusted buffer."""

    def __init__(self, buf: memoryview, pos: int, end: int, what: str):
        self.buf, self.pos, self.end, self.what = buf, pos, end, what

    def take(self, n: int) -> memoryview:
        if n < 0 or self.pos + n > self.end:
            raise FormatError(f"{self.what}: truncated at byte {self.pos} (needs {n} more bytes)")
        out = self.buf[self.pos:self.pos + n]
        self.pos += n
        return out

    def unpack(self, fmt: struct.Struct) -> tuple:
        return fmt.unpack(self.take(fmt.size))


def _parse(buf) -> tuple[int, int, memoryview, list[TensorEntry]]:
    """Check magic, version, sizes and checksums, then read the table; returns (version, model size,
    rest, entries)."""
    mv = memoryview(buf).cast("B")
    if len(mv) < 4 or bytes(mv[:4]) != MAGIC:
        raise FormatError("not a .dsz model file: wrong magic (expected 'DSZM')")
    if len(mv) < _HEADER.size + 2 * _CRC.size:
        raise FormatError(f"truncated .dsz file: {len(mv)} bytes is shorter than its header")
    magic, version, flags, n_tensors, table_bytes, model_bytes, rest_bytes, streams_bytes = \
        _HEADER.unpack(mv[:_HEADER.size])
    if version > FORMAT_VERSION:
        raise FormatError(f".dsz format version {version} is newer than this reader's ({FORMAT_VERSION}): "
                          "upgrade pydsz")
    if version == 0:
        raise FormatError(".dsz format version 0 is not valid")
    head_end = _HEADER.size + table_bytes
    expected = head_end + _CRC.size + rest_bytes + streams_bytes + _CRC.size
    if len(mv) < expected:
        raise FormatError(f"truncated .dsz file: {len(mv)} bytes, its header declares {expected}")
    if len(mv) > expected:
        raise FormatError(f".dsz file has {len(mv) - expected} unexpected bytes after its end")
    (head_crc,) = _CRC.unpack(mv[head_end:head_end + _CRC.size])
    if _crc(mv[:head_end]) != head_crc:
        raise FormatError("checksum mismatch in the .dsz header or tensor table: the file is corrupt")
    (file_crc,) = _CRC.unpack(mv[expected - _CRC.size:expected])
    if _crc(mv[:expected - _CRC.size]) != file_crc:
        raise FormatError("checksum mismatch over the .dsz file: the file is corrupt")
    if flags != 0:
        raise FormatError(f".dsz header flags {flags:#x}: reserved bits must be zero")

    table = _Reader(mv, _HEADER.size, head_end, "tensor table")
    entries = []
    stream_pos = head_end + _CRC.size + rest_bytes
    stream_end = stream_pos + streams_bytes
    for i in range(n_tensors):
        offset, nbytes, buffer_index, rep, dtype, ndim, reserved, bound, stream_bytes, name_len = \
            table.unpack(_ENTRY)
        # a version-1 file holds float32 tensors only: stored dtypes came with version 2
        if rep not in _REPRESENTATIONS or dtype not in DTYPES or (version < 2 and dtype != 0) \
                or (version < 3 and rep == 2) or reserved != 0 or ndim > _MAX_NDIM:
            raise FormatError(f"tensor {i}: unknown representation, dtype or reserved field")
        shape = struct.unpack(f"<{ndim}Q", table.take(8 * ndim))
        name = bytes(table.take(name_len)).decode("utf-8", "replace")
        codec.check_shape(shape, f"tensor {name}")
        spans = gather.read_spans(table.unpack, f"tensor {name}", ndim, math.prod(shape), DTYPES[dtype], offset,
                                  model_bytes) if rep == 2 else ()
        if math.prod(shape) * np.dtype(DTYPES[dtype]).itemsize != nbytes \
                or (not spans and offset + nbytes > model_bytes):
            raise FormatError(f"tensor {name}: shape {shape} or place [{offset}, +{nbytes}) "
                              f"does not fit a model of {model_bytes} bytes")
        if stream_pos + stream_bytes > stream_end:
            raise FormatError(f"tensor {name}: stream runs past the end of the stream section")
        stream = bytes(mv[stream_pos:stream_pos + stream_bytes])
        stream_pos += stream_bytes
        entries.append(TensorEntry(name, buffer_index, offset, nbytes, tuple(shape),
                                   _REPRESENTATIONS[rep], bound, stream, DTYPES[dtype], spans))
    if table.pos != head_end or stream_pos != stream_end:
        raise FormatError("tensor table sizes do not add up to the declared section sizes")
    spans = sorted(hole for e in entries for hole in e.holes)
    if any(a_end > b_start for (_, a_end), (b_start, _) in zip(spans, spans[1:])):
        raise FormatError("tensor table: two tensors overlap in the model file")
    rest = mv[head_end + _CRC.size:head_end + _CRC.size + rest_bytes]
    # the model's size decides an allocation: check it against what the rest can hold first
    if model_bytes > _ZSTD_MAX_RATIO * rest_bytes:
        raise FormatError(f"the header declares a model of {model_bytes} bytes, more than a zstd frame "
                          f"of {rest_bytes} bytes can hold")
    try:
        declared = zstandard.frame_content_size(rest)
    except zstandard.ZstdError as exc:
        raise FormatError(f"the model's lossless section is not a zstd frame: {exc}") from None
    if declared != model_bytes:
        raise FormatError(f"the model's lossless section declares {declared} bytes, the header {model_bytes}")
    return version, model_bytes, rest, entries


def _decode_tensor(e: TensorEntry, out: np.ndarray | None = None) -> np.ndarray:
    """Decode one tensor's stream, into `out` (e.dtype, e.shape) when given."""
    decode = codec.decode_sparse if e.representation == "sparse" else codec.decompress_array
    try:
        w = decode(e.stream, out=out)
    except ValueError as exc:  # `out` does not match what the stream declares
        raise FormatError(f"tensor {e.name}: {exc}; the table says {e.dtype} {e.shape}") from None
    except DszError as exc:
        raise FormatError(f"tensor {e.name}: {exc}") from None
    if w.size * e.itemsize != e.nbytes or w.dtype != np.dtype(e.dtype):
        raise FormatError(f"tensor {e.name}: stream decodes to {w.dtype} {w.shape}, table says {e.dtype} {e.shape}")
    return w.reshape(e.shape)


def tensor_place(out: np.ndarray, e: TensorEntry) -> np.ndarray | None:
    """The view of tensor e's bytes in out (the model, uint8) as its stored dtype, or None where a
    decoder cannot write values there directly: an offset that is not a multiple of the dtype's size
    (no TFLite writer makes one), or a gathered entry (its values go to several places: gather.scatter)."""
    if e.representation == "gathered":
        return None
    place = out[e.offset:e.offset + e.nbytes].view(np.dtype(e.dtype).newbyteorder("<"))
    return place.reshape(e.shape) if place.flags.aligned and place.dtype == np.dtype(e.dtype) else None


class DszModel:
    """A .dsz file opened for decoding: the model's bytes, its weights and what was done to them."""

    def __init__(self, buf):
        self.version, self._model_bytes, rest, self.entries = _parse(buf)
        self._rest = rest
        self._tflite = None

    def tflite_bytes(self) -> bytes:
        """The decoded .tflite model (cached after the first call).

        The rest of the model is inflated, and every tensor decoded, straight into the bytes object
        that is returned: no copy of the model is made on the way.
        """
        if self._tflite is None:
            self._tflite = self.filled_bytes(self._fill)
        return self._tflite

    def filled_bytes(self, fill) -> bytes:
        """A new bytes object of the model's size, written in place by fill(out) (out: a uint8 view of
        it, which fill must not keep) before anything else can see it."""
        try:
            writer = _core.BytesWriter(self._model_bytes)
        except MemoryError:
            raise DszError(f"not enough memory to decode a model of {self._model_bytes} bytes") from None
        fill(np.frombuffer(writer, dtype=np.uint8))
        return writer.take()

    def _fill(self, out: np.ndarray) -> None:
        self.inflate_rest(out)
        for e in self.entries:
            place = tensor_place(out, e)
            if place is not None:
                _decode_tensor(e, out=place)
            elif e.representation == "gathered":
                gather.scatter(out, e.spans, _decode_tensor(e), e.itemsize)
            else:
                w = _decode_tensor(e)
                out[e.offset:e.offset + e.nbytes].view(w.dtype)[:] = w.reshape(-1)

    def inflate_rest(self, out: np.ndarray) -> None:
        """Inflate the lossless rest of the model into out (uint8[model_bytes]), all but the bytes of
        the compressed tensors: the rest holds zeros there, and their decoders write every one of them.

        Those zeros (nearly all of a large model's rest) are inflated into a small buffer that stays in
        cache instead of into the model's memory, which the decoders would then write a second time.
        """
        n = self._model_bytes
        keep, pos = [], 0  # (start, end) of the model's bytes that only the rest provides
        for start, end in sorted(hole for e in self.entries for hole in e.holes):
            if start > pos:
                keep.append((pos, start))
            pos = max(pos, end)
        if pos < n:
            keep.append((pos, n))
        chunk = np.empty(_INFLATE_CHUNK, np.uint8)
        try:
            got, k = 0, 0
            with zstandard.ZstdDecompressor().stream_reader(self._rest) as reader:
                view = memoryview(chunk)
                while got < n:
                    step = reader.readinto(view[:min(_INFLATE_CHUNK, n - got)])
                    if not step:
                        break
                    end = got + step
                    while k < len(keep) and keep[k][0] < end:
                        a, b = max(keep[k][0], got), min(keep[k][1], end)
                        out[a:b] = chunk[a - got:b - got]
                        if keep[k][1] > end:
                            break
                        k += 1
                    got = end
                view.release()
                excess = reader.read(1)
        except zstandard.ZstdError as exc:
            raise FormatError(f"the model's lossless section does not decompress: {exc}") from None
        if got != n or excess:
            raise FormatError(f"the model's lossless section holds {'more than ' if excess else ''}"
                              f"{got} bytes, the header declares {n}")

    def weights(self) -> dict[str, np.ndarray]:
        """Decoded weight tensors by layer name, in their stored dtype (a shared buffer appears under
        each of its layers)."""
        out = {}
        for e in self.entries:
            w = _decode_tensor(e)
            if e.representation == "gathered":
                out.update(gather.named(e.name.split(","), e.spans, w))
                continue
            for name in e.name.split(","):
                out[name] = w
        return out

    def info(self) -> dict:
        """Per compressed tensor: shape, density, bound, original and compressed bytes, ratio; and totals."""
        tensors = []
        for e in self.entries:
            # original_bytes: the tensor's bytes as the model stores them (2 per float16 value)
            row = {"name": gather.label(e.name.split(",")) if e.spans else e.name, "buffer": e.buffer_index,
                   "shape": list(e.shape), "dtype": e.dtype, "representation": e.representation,
                   "error_bound": e.error_bound, "bound_unit": "steps" if e.dtype in ("int8", "uint8") else "absolute",
                   "original_bytes": e.nbytes, "compressed_bytes": len(e.stream),
                   "ratio": e.nbytes / max(len(e.stream), 1)}
            if e.representation == "sparse":
                s = codec.sparse_info(e.stream)
                row.update(density=s["nnz"] / max(e.nbytes // e.itemsize, 1), data_bytes=s["data_bytes"],
                           index_bytes=s["index_bytes"], index_codec=s["index_codec"])
            else:
                # a dense stream has no index; its density is only known by decoding it
                w = _decode_tensor(e)
                row.update(density=np.count_nonzero(w) / max(w.size, 1), data_bytes=len(e.stream),
                           index_bytes=0, index_codec=None)
            tensors.append(row)
        original = sum(t["original_bytes"] for t in tensors)
        compressed = sum(t["compressed_bytes"] for t in tensors)
        return {
            "format_version": self.version, "model_bytes": self._model_bytes,
            "rest_bytes": len(self._rest), "tensors": tensors,
            "compressed_tensors": {"original_bytes": original, "compressed_bytes": compressed,
                                   "ratio": original / compressed if compressed else None},
        }

    def interpreter(self, num_threads: int | None = None):
        """A TFLite Interpreter on the decoded model (ai-edge-litert, else tflite-runtime, else TensorFlow)."""
        from .runtime import make_interpreter

        return make_interpreter(self.tflite_bytes(), num_threads=num_threads)


def load(path_or_bytes) -> DszModel:
    """Open a .dsz model from a path or from bytes."""
    if isinstance(path_or_bytes, (str, os.PathLike)):
        return DszModel(read_file(path_or_bytes))
    return DszModel(path_or_bytes)


def read_file(path) -> bytes:
    """A file's bytes, with a one-line InputError instead of an OSError traceback."""
    try:
        return Path(path).read_bytes()
    except FileNotFoundError:
        raise InputError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise InputError(f"{path}: is a directory") from None
    except OSError as exc:
        raise InputError(f"{path}: {exc.strerror}") from None


def write_atomic(path, data: bytes) -> None:
    """Write through a temporary file in the same directory and rename it, so no partial file is ever left."""
    path = Path(path)
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent or ".")
    except OSError as exc:
        raise InputError(f"{path}: cannot write: {exc.strerror}") from None
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        # mkstemp creates 0600; give the file the permissions an ordinary open() would
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def write_model(tflite_path, dsz_path, error_bounds: Bounds, layers: str = "fc") -> DszModel:
    """Compress the .tflite at tflite_path into dsz_path; returns the written model, opened."""
    packed = pack_model(read_file(tflite_path), error_bounds, layers=layers)
    write_atomic(dsz_path, packed)
    return DszModel(packed)
