"""Error-bounded codecs for weight arrays and pruned (sparse) weight matrices.

Values may be float32, float16, int8 or uint8 (the dtype a tensor is stored in): the bound holds
for the values in that dtype, after the rounding to it. For int8 and uint8 the bound is a number
of quantization steps k (an integer, 0 = lossless): every decoded integer is within k of the
original, so the real value is within k * scale of its channel.

libdsz (through pydsz._core) does prediction, quantization and entropy coding and writes
frames whose sections are raw; this module checks arguments, handles numpy layouts and has
pydsz.format.wrapping wrap sections with a general-purpose lossless codec when that makes them smaller.
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np

from pydsz import _core
from pydsz.errors import DszError, FormatError, InputError
from pydsz.format import wrapping

__all__ = ["compress_array", "decompress_array", "encode_sparse", "decode_sparse", "decode_sparse_csr", "sparse_info",
           "stored_array"]

MODES = {"abs": 0, "rel": 1}
PREDICTORS = {"none": 0, "lorenzo": 1, "auto": 255}
PREDICTOR_NAMES = {0: "none", 1: "lorenzo"}
INDEX_CODECS = {"gap8": 0, "huffgap": 1, "bitmap": 2}
INDEX_CODEC_NAMES = {v: k for k, v in INDEX_CODECS.items()}
BITMAP_MIN_GAIN = 0.97


# the frame's dtype ids (doc/format.md) by numpy dtype
DTYPE_IDS = {np.dtype(np.float32): 1, np.dtype(np.float16): 2, np.dtype(np.int8): 3, np.dtype(np.uint8): 4}
DTYPE_NAMES = {1: "float32", 2: "float16", 3: "int8", 4: "uint8"}
_INTEGER_IDS = (3, 4)
MAX_STEPS = 255


# ---- argument checking ----

def _check_values(x: Any, what: str) -> tuple[np.ndarray, int]:
    """The array (little-endian) and its frame dtype id."""
    a = np.asarray(x)
    dtype_id = DTYPE_IDS.get(a.dtype)  # a big-endian array is none of them
    if dtype_id is None:
        raise InputError(f"{what}: float32, float16, int8 or uint8 values are supported, got {a.dtype}; "
                         "cast with x.astype(numpy.float32)")
    return a, dtype_id


def _check_bound(error_bound: Any, mode: str, dtype_id: int = 1) -> float:
    if mode not in MODES:
        raise InputError(f"mode must be 'abs' or 'rel', got {mode!r}")
    try:
        eb = float(error_bound)
    except (TypeError, ValueError):
        raise InputError(f"error_bound must be a number, got {error_bound!r}") from None
    if dtype_id in _INTEGER_IDS:
        if mode != "abs" or not 0 <= eb <= MAX_STEPS or eb != int(eb):
            raise InputError(f"error_bound {error_bound!r} of {DTYPE_NAMES[dtype_id]} values must be a whole "
                             f"number of quantization steps in 0..{MAX_STEPS} (mode 'abs')")
        return eb
    if not math.isfinite(eb) or eb <= 0:
        raise InputError(f"error_bound {error_bound!r} must be finite and > 0")
    return eb


def stored_array(w: Any) -> np.ndarray:
    """w, C-contiguous, in the dtype the codecs store it in: float16, int8 and uint8 stay as they
    are, anything else becomes float32."""
    a = np.asarray(w)
    return np.ascontiguousarray(a, dtype=a.dtype if DTYPE_IDS.get(a.dtype, 1) != 1 else np.float32)


def _frame_bound(eb: float, dtype_id: int) -> float:
    """The bound a frame holds: k steps of an integer dtype are the bound k + 1/2 (an odd step 2k + 1)."""
    return eb + 0.5 if dtype_id in _INTEGER_IDS else eb


def frame_steps(info: dict) -> float:
    """What a frame's bound means to its user: the absolute bound, or the steps of an integer dtype."""
    return info["error_bound"] - 0.5 if info["dtype"] in _INTEGER_IDS else info["error_bound"]


def _check_choice(value: str, choices: dict, what: str) -> int:
    if value not in choices:
        raise InputError(f"{what} must be one of {sorted(choices)}, got {value!r}")
    return choices[value]


def _check_radius(radius: int) -> int:
    if not 1 <= int(radius) <= 1 << 20:
        raise InputError(f"radius must be in 1..{1 << 20}, got {radius!r}")
    return int(radius)


def _absolute_bound(values: np.ndarray, eb: float, mode: str) -> float:
    """The absolute bound: eb itself, or eb * (max - min) of the finite values (SZ's relative mode)."""
    if mode == "abs":
        return eb
    finite = values[np.isfinite(values)]
    if finite.size == 0:
        return eb
    lo, hi = float(finite.min()), float(finite.max())
    bound = eb * (hi - lo)
    if bound <= 0:  # constant data: any bound is exact there; keep one relative to the magnitude
        bound = eb * max(abs(lo), abs(hi)) or eb
    if not math.isfinite(bound):
        raise InputError(f"relative error_bound {eb!r} times the value range overflows")
    return bound


# ---- bytes in, sections out ----

def _as_u8(buf: Any) -> np.ndarray:
    if isinstance(buf, np.ndarray):
        return np.ascontiguousarray(buf).reshape(-1).view(np.uint8)
    try:
        view = memoryview(buf)
    except TypeError:
        raise InputError(f"expected a bytes-like object, got {type(buf).__name__}") from None
    if not view.c_contiguous:
        view = memoryview(view.tobytes())
    return np.frombuffer(view.cast("B") if view.ndim == 1 and view.itemsize == 1 else view.tobytes(),
                         dtype=np.uint8)


def check_shape(shape: tuple, what: str) -> None:
    """Refuse a shape numpy cannot make: libdsz bounds the element count, but with a zero extent the
    others may be as large as the header can say, and numpy refuses extents whose product (zeros
    left out) times 4 bytes passes the address space."""
    limit = np.iinfo(np.intp).max
    if any(d > limit for d in shape) or 4 * math.prod(d for d in shape if d) > limit:
        raise FormatError(f"{what}: shape {tuple(shape)} has extents too large to address")


def _open_frame(buf: Any, kind: int, what: str) -> tuple[dict, np.ndarray]:
    u8 = _as_u8(buf)
    try:
        info = _core.frame_info(u8)
    except _core.CoreError as e:
        raise FormatError(f"{what}: bad header: {e.name}") from None
    check_shape(info["shape"], what)
    if info["kind"] != kind:
        other = "sparse (use decode_sparse)" if info["kind"] == _core.KIND_SPARSE else "array (use decompress_array)"
        raise FormatError(f"{what}: this is a {other} stream")
    total = info["header_size"] + info["data_stored"] + info["index_stored"]
    if total != u8.size:
        raise FormatError(f"{what}: DSZ_error_srcSize_wrong: stream is {u8.size} bytes, header declares {total}")
    return info, u8










# ---- array codec ----

def compress_array(x: Any, error_bound: float, mode: str = "abs", *, predictor: str = "auto",
                   radius: int = 32768) -> bytes:
    """Compress an array (float32, float16, int8 or uint8) of any shape and layout so that every
    finite value decodes within the bound (absolute, or relative to the value range in mode 'rel';
    int8/uint8: whole steps, 0 = lossless) after the rounding to its dtype; NaN and Inf round-trip
    exactly."""
    a, dtype_id = _check_values(x, "compress_array")
    eb = _check_bound(error_bound, mode, dtype_id)
    pred = _check_choice(predictor, PREDICTORS, "predictor")
    radius = _check_radius(radius)
    if a.ndim > 8:
        raise InputError(f"compress_array: at most 8 dimensions are supported, got {a.ndim}")
    flat = np.ascontiguousarray(a).reshape(-1)
    shape = tuple(int(s) for s in a.shape)
    if dtype_id == 1:
        bound = _absolute_bound(flat, eb, mode)
        frame = _core.compress(flat, shape, bound, eb, MODES[mode], pred, radius)
    else:
        bound = _frame_bound(_absolute_bound(flat.astype(np.float32), eb, mode), dtype_id)
        frame = _core.compress_typed(flat.view(np.uint8), dtype_id, flat.itemsize, shape, bound, eb,
                                     MODES[mode], pred, radius)
    info = _core.frame_info(frame)
    data = frame[info["header_size"]:]
    codec, stored = wrapping.wrap(data, wrapping.DATA_WRAPPERS)
    if codec == wrapping.NONE:
        return frame
    info.update(data_lossless=codec, data_stored=len(stored))
    return _core.write_header(info) + stored


def _output(out: Any, n: int, what: str, zeroed: bool, dtype_id: int = 1) -> np.ndarray:
    """Where a decoder writes n values of the frame's dtype, flat: the caller's `out` (checked to fit
    exactly, cleared when `zeroed`) or a new array."""
    dtype = np.dtype(_core.DTYPES[dtype_id])
    if out is None:
        try:
            return np.zeros(n, dtype) if zeroed else np.empty(n, dtype)
        except MemoryError:
            raise DszError(f"{what}: no memory for {n} {dtype.name} values") from None
    if not isinstance(out, np.ndarray) or out.dtype != dtype or not out.flags.c_contiguous \
            or not out.flags.writeable or not out.flags.aligned:
        raise InputError(f"{what}: out must be a writeable, aligned, C-contiguous {dtype.name} numpy array "
                         "(the stream's dtype)")
    if out.size != n:
        raise InputError(f"{what}: out holds {out.size} values, the stream decodes to {n}")
    flat = out.reshape(-1)
    if zeroed:
        flat.fill(0)
    return flat


def decode_array_section(info: dict, data: np.ndarray, flat: np.ndarray) -> None:
    """libdsz's decoder for an array frame's raw data section, into flat (the frame's dtype)."""
    if info["dtype"] == 1:
        _core.decompress_array(info, data, flat)
    else:
        _core.decompress_typed(info, data, flat.view(np.uint8), flat.itemsize)


def decode_sparse_sections(info: dict, data: np.ndarray, index: np.ndarray, flat: np.ndarray) -> None:
    """libdsz's fused decoder for a sparse frame's raw sections, into flat (zero-filled, the frame's dtype)."""
    if info["dtype"] == 1:
        _core.decode_sparse(info, data, index, flat)
    else:
        _core.decode_sparse_typed(info, data, index, flat.view(np.uint8), flat.itemsize)


def decompress_array(buf: Any, out: np.ndarray | None = None) -> np.ndarray:
    """Decode a compress_array stream (any bytes-like object) into an array of its shape and dtype,
    or into `out` (an array of that dtype and as many values, C order) without allocating one."""
    info, u8 = _open_frame(buf, _core.KIND_ARRAY, "array stream")
    hs = info["header_size"]
    data = wrapping.inflate(info["data_lossless"], u8[hs:hs + info["data_stored"]], info["data_raw"], "array stream")
    flat = _output(out, info["n_elements"], "decompress_array", zeroed=False, dtype_id=info["dtype"])
    try:
        decode_array_section(info, data, flat)
    except _core.CoreError as e:
        raise FormatError(f"array stream: data section: {e.name}") from None
    return flat.reshape(info["shape"])


# ---- sparse matrices ----

class SparseIndex:
    """The index section encode_sparse chooses for a matrix: it depends on the positions of the
    non-zeros only, not on the bound, so an assessment that encodes one matrix at many bounds
    chooses it once (sparse_index) and passes it to every encode_sparse(..., index=...)."""

    def __init__(self, codec: int, lossless: int, stored: bytes, raw: int, gap8: bytes):
        self.codec, self.lossless, self.stored, self.raw = codec, lossless, stored, raw
        self.gap8 = gap8  # the raw gap8 section: what the matrix's pattern is checked against


def _sparse_matrix(w: Any, index_codec: str) -> tuple[np.ndarray, int]:
    a, dtype_id = _check_values(w, "encode_sparse")
    if a.ndim != 2:
        raise InputError(f"encode_sparse: a 2-D matrix is needed, got {a.ndim} dimensions")
    if index_codec != "auto":
        _check_choice(index_codec, INDEX_CODECS, "index_codec")
    return np.ascontiguousarray(a), dtype_id


def _pattern(a: np.ndarray) -> np.ndarray:
    """A float32 matrix with a's non-zeros where a has them: what the index encoders read (the
    index depends on the positions only, and a float16 or integer value is zero exactly when its
    float32 conversion is)."""
    return a if a.dtype == np.float32 else a.astype(np.float32)


def _choose_index(a: np.ndarray, index_codec: str, first: int, section: bytes) -> SparseIndex:
    """The smallest index section among the codecs index_codec allows; `section` is the one the
    frame was encoded with (codec `first`)."""
    candidates = []  # (index codec, lossless codec, stored bytes, raw size)
    gap8 = section if first == INDEX_CODECS["gap8"] else _core.encode_sparse_index(a, INDEX_CODECS["gap8"])
    if index_codec in ("auto", "gap8"):
        candidates.append((INDEX_CODECS["gap8"], *wrapping.wrap(gap8, wrapping.gap8_wrappers(len(gap8))), len(gap8)))
    if index_codec in ("auto", "huffgap"):
        huff = section if first == INDEX_CODECS["huffgap"] else _core.encode_sparse_index(a, INDEX_CODECS["huffgap"])
        candidates.append((INDEX_CODECS["huffgap"], *wrapping.wrap(huff, wrapping.DATA_WRAPPERS), len(huff)))
    best = min(candidates, key=lambda c: len(c[2])) if candidates else None
    if index_codec in ("auto", "bitmap"):
        bitmap = section if first == INDEX_CODECS["bitmap"] else _core.encode_sparse_index(a, INDEX_CODECS["bitmap"])
        # the bitmap decodes slower than the gap codecs: take it only when clearly smaller
        if best is None or len(bitmap) < BITMAP_MIN_GAIN * len(best[2]):
            best = (INDEX_CODECS["bitmap"], wrapping.NONE, bitmap, len(bitmap))
    return SparseIndex(*best, gap8=gap8)


def sparse_index(w: Any, index_codec: str = "auto") -> SparseIndex:
    """The index section encode_sparse(w, ..., index_codec) would choose, for reuse at other bounds."""
    a = _pattern(_sparse_matrix(w, index_codec)[0])
    first = INDEX_CODECS["gap8"] if index_codec == "auto" else INDEX_CODECS[index_codec]
    return _choose_index(a, index_codec, first, _core.encode_sparse_index(a, first))


def encode_sparse(w: Any, error_bound: float, mode: str = "abs", index_codec: str = "auto", *,
                  predictor: str = "auto", radius: int = 32768, index: SparseIndex | None = None) -> bytes:
    """Encode a 2-D matrix (float32, float16, int8 or uint8) as its non-zeros (error-bounded, row-major) and their
    positions (lossless, with the smallest index codec when index_codec='auto').
    In mode 'rel' the bound is relative to the range of the non-zero finite values.
    index: sparse_index(w, index_codec), chosen once for many bounds (the same bytes come out,
    faster); ValueError if w's non-zeros are not where that index has them."""
    a, dtype_id = _sparse_matrix(w, index_codec)
    eb = _check_bound(error_bound, mode, dtype_id)
    pred = _check_choice(predictor, PREDICTORS, "predictor")
    radius = _check_radius(radius)
    first = INDEX_CODECS["gap8"] if index_codec == "auto" or index is not None else INDEX_CODECS[index_codec]
    if dtype_id == 1:
        bound = _absolute_bound(a[a != 0] if mode == "rel" else a, eb, mode)
        frame = _core.encode_sparse(a, bound, eb, MODES[mode], pred, radius, first)
    else:
        values = a.astype(np.float32)
        bound = _frame_bound(_absolute_bound(values[values != 0] if mode == "rel" else values, eb, mode), dtype_id)
        frame = _core.encode_sparse_typed(a.reshape(-1).view(np.uint8), dtype_id, a.shape[0], a.shape[1], bound,
                                          eb, MODES[mode], pred, radius, first)
    info = _core.frame_info(frame)
    hs, dr = info["header_size"], info["data_raw"]
    if index is None:
        index = _choose_index(_pattern(a), index_codec, first, frame[hs + dr:])
    elif frame[hs + dr:] != index.gap8:
        raise InputError("encode_sparse: the index given was chosen for a matrix with other non-zero positions")
    data_lossless, data_bytes = wrapping.wrap(frame[hs:hs + dr], wrapping.DATA_WRAPPERS)
    info.update(index_codec=index.codec, index_lossless=index.lossless, index_raw=index.raw,
                index_stored=len(index.stored), data_lossless=data_lossless, data_stored=len(data_bytes))
    return _core.write_header(info) + data_bytes + index.stored


def _sparse_sections(buf: Any) -> tuple[dict, np.ndarray, np.ndarray]:
    """A sparse stream's header and its data and index sections, unwrapped."""
    info, u8 = _open_frame(buf, _core.KIND_SPARSE, "sparse stream")
    hs, ds = info["header_size"], info["data_stored"]
    data = wrapping.inflate(info["data_lossless"], u8[hs:hs + ds], info["data_raw"], "sparse stream: data section")
    index = wrapping.inflate(info["index_lossless"], u8[hs + ds:], info["index_raw"], "sparse stream: index section")
    return info, data, index


def decode_sparse(buf: Any, out: np.ndarray | None = None) -> np.ndarray:
    """Rebuild the dense matrix (of the stream's dtype) of an encode_sparse stream (any bytes-like
    object), or write it into `out` (an array of that dtype, rows*cols values, C order), which is
    zeroed first."""
    info, data, index = _sparse_sections(buf)
    rows, cols = info["shape"]
    # the decoder writes the non-zeros only
    flat = _output(out, info["n_elements"], "decode_sparse", zeroed=True, dtype_id=info["dtype"])
    try:
        decode_sparse_sections(info, data, index, flat)
    except _core.CoreError as e:
        raise FormatError(f"sparse stream ({rows}x{cols}, nnz {info['nnz']}): {e.name}") from None
    return flat.reshape(rows, cols)


def decode_sparse_csr(buf: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The CSR form of an encode_sparse stream's matrix, decoded with no dense matrix in between:
    (row_ptr int64 [rows + 1], col_index int32 [nnz], values float32 [nnz]), the non-zeros row by
    row, columns increasing; exactly what CSR.from_dense(decode_sparse(buf)) holds, values of a
    float16, int8 or uint8 stream widened to float32. The row pointers take 8 bytes a row however few
    the non-zeros: from an untrusted source, check sparse_info's rows first (288 valid bytes can
    declare 654M rows: 5 GB of pointers)."""
    info, data, index = _sparse_sections(buf)
    rows, cols = info["shape"]
    nnz = info["nnz"]
    what = f"sparse stream ({rows}x{cols}, nnz {nnz})"
    if cols > 2 ** 31:
        raise InputError(f"{what}: a CSR matrix has at most 2^31 columns")
    try:
        if cols == 0:
            # no non-zero fits, but the header may declare any number of rows: the sections are
            # checked (by the dense decoder, which then writes nothing) before rows + 1 pointers exist
            decode_sparse_sections(info, data, index, _output(None, 0, what, zeroed=False, dtype_id=info["dtype"]))
            return _csr_arrays(rows, 0, what, np.zeros)
        # the header allows at most 8 non-zeros per byte of the data section: the arrays of entries
        # stay within a multiple of the inflated input; the row pointers are what the shape asks for
        row_ptr, col_index, values = _csr_arrays(rows, nnz, what, np.empty)
        _core.decode_sparse_csr(info, data, index, row_ptr, col_index, values)
    except _core.CoreError as e:
        raise FormatError(f"{what}: {e.name}") from None
    return row_ptr, col_index, values


def _csr_arrays(rows: int, nnz: int, what: str, make) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """row_ptr, col_index and values for rows and nnz, made by `make` (np.empty or np.zeros)."""
    try:
        return make(rows + 1, np.int64), make(nnz, np.int32), make(nnz, np.float32)
    except (MemoryError, ValueError):
        raise DszError(f"{what}: no memory for its CSR arrays") from None


def sparse_info(buf: Any) -> dict:
    """What a sparse stream holds: shape, nnz, bound, codecs and section sizes (header only)."""
    info, u8 = _open_frame(buf, _core.KIND_SPARSE, "sparse stream")
    return {
        "rows": info["shape"][0],
        "cols": info["shape"][1],
        "nnz": info["nnz"],
        "dtype": DTYPE_NAMES[info["dtype"]],
        "error_bound": frame_steps(info),
        "user_bound": info["user_bound"],
        "mode": "rel" if info["mode"] else "abs",
        "predictor": PREDICTOR_NAMES[info["predictor"]],
        "radius": info["radius"],
        "index_codec": INDEX_CODEC_NAMES[info["index_codec"]],
        "data_lossless": wrapping.NAMES[info["data_lossless"]],
        "index_lossless": wrapping.NAMES[info["index_lossless"]],
        "header_bytes": info["header_size"],
        "data_bytes": info["data_stored"],
        "index_bytes": info["index_stored"],
        "total_bytes": int(u8.size),
        "format_version": info["version"],
    }

