# cython: boundscheck=False, wraparound=False
"""Thin binding of libdsz: raw C streams in and out, the GIL released around every C call.

Lossless wrapping of sections, argument checking and numpy layout handling live in codec.py.
"""
from cpython.buffer cimport PyBuffer_FillInfo
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize
from libc.stdint cimport uint8_t
from libc.stdlib cimport free, malloc
from libc.string cimport memset

import numpy as np

from pydsz.errors import FormatError


# libdsz is compiled into this module: its experimental, section-level API (dsz_frameInfo) is ours
cdef extern from *:
    """
    #define DSZ_STATIC_LINKING_ONLY
    """

cdef extern from "dsz.h" nogil:
    ctypedef struct dsz_params:
        pass

    ctypedef enum dsz_parameter:
        dsz_p_errorBound, dsz_p_userBound, dsz_p_mode, dsz_p_predictor, dsz_p_radius

    ctypedef struct dsz_frameInfo:
        unsigned kind, version, dtype, ndim, predictor, mode, radius
        unsigned indexCodec, dataLossless, indexLossless
        double errorBound, userBound
        unsigned long long shape[8]
        unsigned long long nElements, nnz
        unsigned long long dataRawSize, dataStoredSize, indexRawSize, indexStoredSize
        size_t headerSize

    unsigned dsz_isError(size_t code)
    const char* dsz_getErrorName(size_t code)
    int dsz_getErrorCode(size_t code)
    unsigned dsz_versionNumber()
    dsz_params* dsz_createParams()
    size_t dsz_freeParams(dsz_params* params)
    size_t dsz_params_setParameter(dsz_params* params, dsz_parameter param, double value)
    size_t dsz_compressBound(size_t n, unsigned radius)
    size_t dsz_compress(void* dst, size_t cap, const float* src, const unsigned long long* shape,
                        unsigned ndim, const dsz_params* params)
    size_t dsz_getFrameInfo(dsz_frameInfo* info, const void* src, size_t srcSize)
    size_t dsz_writeFrameHeader(void* dst, size_t cap, const dsz_frameInfo* info)
    size_t dsz_decompressArray(float* dst, size_t cap, const dsz_frameInfo* info,
                               const void* data, size_t dataSize)
    size_t dsz_decodeArrayDelta(float* dst, size_t cap, const float* base, const dsz_frameInfo* info,
                                const void* data, size_t dataSize)
    size_t dsz_sparseBound(size_t rows, size_t cols, size_t nnz, unsigned radius)
    size_t dsz_encodeSparse(void* dst, size_t cap, const float* w, size_t rows, size_t cols,
                            const dsz_params* params, unsigned indexCodec)
    size_t dsz_encodeSparseIndex(void* dst, size_t cap, const float* w, size_t rows, size_t cols,
                                 unsigned indexCodec)
    size_t dsz_decodeSparse(float* dst, size_t cap, const dsz_frameInfo* info,
                            const void* data, size_t dataSize, const void* index, size_t indexSize)
    size_t dsz_compressTyped(void* dst, size_t cap, const void* src, unsigned dtype,
                             const unsigned long long* shape, unsigned ndim, const dsz_params* params)
    size_t dsz_decompressArrayTyped(void* dst, size_t cap, const dsz_frameInfo* info,
                                    const void* data, size_t dataSize)
    size_t dsz_encodeSparseTyped(void* dst, size_t cap, const void* w, unsigned dtype, size_t rows,
                                 size_t cols, const dsz_params* params, unsigned indexCodec)
    size_t dsz_decodeSparseTyped(void* dst, size_t cap, const dsz_frameInfo* info,
                                 const void* data, size_t dataSize, const void* index, size_t indexSize)

KIND_ARRAY = 1
KIND_SPARSE = 2
FORMAT_VERSION = 2
# frame dtype ids and their numpy types (little-endian)
DTYPES = {1: "<f4", 2: "<f2", 3: "i1", 4: "u1"}
VERSION_NUMBER = dsz_versionNumber()


class CoreError(FormatError):
    """A libdsz call failed; .code is the stable C error enum, .name its DSZ_error_ name."""

    def __init__(self, name, code, context):
        super().__init__(f"{context}: {name}")
        self.name = name
        self.code = code


cdef size_t check(size_t r, str context) except? 0:
    if dsz_isError(r):
        raise CoreError(dsz_getErrorName(r).decode(), dsz_getErrorCode(r), context)
    return r


cdef dsz_params* new_params(double eb, double user, unsigned mode, unsigned predictor, unsigned radius,
                            str context) except NULL:
    """A parameter object set to the arguments; the caller frees it with dsz_freeParams."""
    cdef dsz_params* p = dsz_createParams()
    if p == NULL:
        raise MemoryError()
    try:
        check(dsz_params_setParameter(p, dsz_p_errorBound, eb), context)
        check(dsz_params_setParameter(p, dsz_p_userBound, user), context)
        check(dsz_params_setParameter(p, dsz_p_mode, mode), context)
        check(dsz_params_setParameter(p, dsz_p_predictor, predictor), context)
        check(dsz_params_setParameter(p, dsz_p_radius, radius), context)
    except BaseException:
        dsz_freeParams(p)
        raise
    return p


cdef bytes take(uint8_t* buf, size_t size):
    return (<char*>buf)[:size]


def compress(const float[::1] x, tuple shape, double eb, double user, unsigned mode,
             unsigned predictor, unsigned radius):
    """Array frame (sections raw) of the C-ordered values x with the given shape."""
    cdef unsigned long long cshape[8]
    cdef unsigned ndim = len(shape), i
    cdef dsz_params* p = NULL
    cdef size_t n = x.shape[0], cap, r
    cdef uint8_t* dst
    cdef const float* src = &x[0] if n else NULL
    if ndim > 8:
        raise ValueError(f"at most 8 dimensions are supported, got {ndim}")
    for i in range(ndim):
        cshape[i] = shape[i]
    cap = check(dsz_compressBound(n, radius), "compressBound")
    dst = <uint8_t*>malloc(cap)
    if dst == NULL:
        raise MemoryError()
    try:
        p = new_params(eb, user, mode, predictor, radius, "compress")
        with nogil:
            r = dsz_compress(dst, cap, src, cshape, ndim, p)
        check(r, "compress")
        return take(dst, r)
    finally:
        dsz_freeParams(p)
        free(dst)


def compress_typed(const uint8_t[::1] raw, unsigned dtype, unsigned itemsize, tuple shape, double eb,
                   double user, unsigned mode, unsigned predictor, unsigned radius):
    """Array frame (sections raw) of the values of dtype in raw (C order, little-endian)."""
    cdef unsigned long long cshape[8]
    cdef unsigned ndim = len(shape), i
    cdef dsz_params* p = NULL
    cdef size_t n = raw.shape[0] // itemsize, cap, r
    cdef uint8_t* dst
    cdef const uint8_t* src = &raw[0] if raw.shape[0] else NULL
    if ndim > 8:
        raise ValueError(f"at most 8 dimensions are supported, got {ndim}")
    for i in range(ndim):
        cshape[i] = shape[i]
    cap = check(dsz_compressBound(n, radius), "compressBound")
    dst = <uint8_t*>malloc(cap)
    if dst == NULL:
        raise MemoryError()
    try:
        p = new_params(eb, user, mode, predictor, radius, "compress")
        with nogil:
            r = dsz_compressTyped(dst, cap, src, dtype, cshape, ndim, p)
        check(r, "compress")
        return take(dst, r)
    finally:
        dsz_freeParams(p)
        free(dst)


def frame_info(const uint8_t[::1] buf):
    """Parsed and validated header of a frame, as a dict."""
    cdef dsz_frameInfo f
    cdef size_t r
    cdef size_t size = buf.shape[0]
    cdef const uint8_t* src = &buf[0] if size else NULL
    with nogil:
        r = dsz_getFrameInfo(&f, src, size)
    check(r, "header")
    return {
        "kind": f.kind, "version": f.version, "dtype": f.dtype, "ndim": f.ndim,
        "predictor": f.predictor, "mode": f.mode, "radius": f.radius,
        "index_codec": f.indexCodec, "data_lossless": f.dataLossless,
        "index_lossless": f.indexLossless, "error_bound": f.errorBound, "user_bound": f.userBound,
        "shape": tuple(f.shape[i] for i in range(f.ndim)), "n_elements": f.nElements, "nnz": f.nnz,
        "data_raw": f.dataRawSize, "data_stored": f.dataStoredSize,
        "index_raw": f.indexRawSize, "index_stored": f.indexStoredSize,
        "header_size": f.headerSize,
    }


cdef int to_info(dict d, dsz_frameInfo* f) except -1:
    cdef unsigned i
    memset(f, 0, sizeof(dsz_frameInfo))
    f.kind = d["kind"]
    f.version = d["version"]
    f.dtype = d["dtype"]
    f.ndim = d["ndim"]
    f.predictor = d["predictor"]
    f.mode = d["mode"]
    f.radius = d["radius"]
    f.indexCodec = d["index_codec"]
    f.dataLossless = d["data_lossless"]
    f.indexLossless = d["index_lossless"]
    f.errorBound = d["error_bound"]
    f.userBound = d["user_bound"]
    for i in range(f.ndim):
        f.shape[i] = d["shape"][i]
    f.nElements = d["n_elements"]
    f.nnz = d["nnz"]
    f.dataRawSize = d["data_raw"]
    f.dataStoredSize = d["data_stored"]
    f.indexRawSize = d["index_raw"]
    f.indexStoredSize = d["index_stored"]
    f.headerSize = d["header_size"]
    return 0


def write_header(dict info):
    """Header bytes for the description `info` (a dict as frame_info returns)."""
    cdef dsz_frameInfo f
    cdef uint8_t buf[128]
    cdef size_t r
    to_info(info, &f)
    with nogil:
        r = dsz_writeFrameHeader(buf, sizeof(buf), &f)
    check(r, "writing header")
    return take(buf, r)


def decompress_array(dict info, const uint8_t[::1] data, float[::1] out):
    """Decode an array frame's raw data section into out (info['n_elements'] values)."""
    cdef dsz_frameInfo f
    cdef size_t r, size = data.shape[0], cap = out.shape[0]
    cdef const uint8_t* src = &data[0] if size else NULL
    cdef float* dst = &out[0] if cap else NULL
    to_info(info, &f)
    with nogil:
        r = dsz_decompressArray(dst, cap, &f, src, size)
    check(r, "data section")


def decode_array_delta(dict info, const uint8_t[::1] data, const float[::1] base, float[::1] out):
    """out = base + an array frame's values (its raw data section), in one pass."""
    cdef dsz_frameInfo f
    cdef size_t r, size = data.shape[0], cap = out.shape[0]
    cdef const uint8_t* src = &data[0] if size else NULL
    cdef const float* held = &base[0] if base.shape[0] else NULL
    cdef float* dst = &out[0] if cap else NULL
    if base.shape[0] < cap:
        raise ValueError("decode_array_delta: base holds fewer values than out")
    to_info(info, &f)
    with nogil:
        r = dsz_decodeArrayDelta(dst, cap, held, &f, src, size)
    check(r, "data section")


def decompress_typed(dict info, const uint8_t[::1] data, uint8_t[::1] out, unsigned itemsize):
    """Decode an array frame's raw data section into out: the bytes of its values in the frame's dtype."""
    cdef dsz_frameInfo f
    cdef size_t r, size = data.shape[0], cap = out.shape[0] // itemsize
    cdef const uint8_t* src = &data[0] if size else NULL
    cdef uint8_t* dst = &out[0] if out.shape[0] else NULL
    to_info(info, &f)
    with nogil:
        r = dsz_decompressArrayTyped(dst, cap, &f, src, size)
    check(r, "data section")


def encode_sparse_typed(const uint8_t[::1] raw, unsigned dtype, size_t rows, size_t cols, double eb,
                        double user, unsigned mode, unsigned predictor, unsigned radius, unsigned index_codec):
    """Sparse frame (sections raw) of the rows x cols values of dtype in raw (C order, little-endian)."""
    cdef dsz_params* p = NULL
    cdef size_t cap, r
    cdef const uint8_t* src = &raw[0] if raw.shape[0] else NULL
    cdef uint8_t* dst
    cap = check(dsz_sparseBound(rows, cols, rows * cols, radius), "sparseBound")
    dst = <uint8_t*>malloc(cap)
    if dst == NULL:
        raise MemoryError()
    try:
        p = new_params(eb, user, mode, predictor, radius, "encodeSparse")
        with nogil:
            r = dsz_encodeSparseTyped(dst, cap, src, dtype, rows, cols, p, index_codec)
        check(r, "encodeSparse")
        return take(dst, r)
    finally:
        dsz_freeParams(p)
        free(dst)


def decode_sparse_typed(dict info, const uint8_t[::1] data, const uint8_t[::1] index, uint8_t[::1] out,
                        unsigned itemsize):
    """Scatter a sparse frame's raw sections into out (the bytes of its values in the frame's dtype),
    which must be zero-filled."""
    cdef dsz_frameInfo f
    cdef size_t r, ds = data.shape[0], isz = index.shape[0], cap = out.shape[0] // itemsize
    cdef const uint8_t* dp = &data[0] if ds else NULL
    cdef const uint8_t* ip = &index[0] if isz else NULL
    cdef uint8_t* dst = &out[0] if out.shape[0] else NULL
    to_info(info, &f)
    with nogil:
        r = dsz_decodeSparseTyped(dst, cap, &f, dp, ds, ip, isz)
    check(r, "sparse sections")


def encode_sparse(const float[:, ::1] w, double eb, double user, unsigned mode, unsigned predictor,
                  unsigned radius, unsigned index_codec):
    """Sparse frame (sections raw) of the C-ordered matrix w."""
    cdef dsz_params* p = NULL
    cdef size_t rows = w.shape[0], cols = w.shape[1], cap, r
    cdef const float* src = &w[0, 0] if rows * cols else NULL
    cdef uint8_t* dst
    cap = check(dsz_sparseBound(rows, cols, rows * cols, radius), "sparseBound")
    dst = <uint8_t*>malloc(cap)
    if dst == NULL:
        raise MemoryError()
    try:
        p = new_params(eb, user, mode, predictor, radius, "encodeSparse")
        with nogil:
            r = dsz_encodeSparse(dst, cap, src, rows, cols, p, index_codec)
        check(r, "encodeSparse")
        return take(dst, r)
    finally:
        dsz_freeParams(p)
        free(dst)


def encode_sparse_index(const float[:, ::1] w, unsigned index_codec):
    """Raw index section of the matrix w under an index codec."""
    cdef size_t rows = w.shape[0], cols = w.shape[1], cap, r
    cdef const float* src = &w[0, 0] if rows * cols else NULL
    cdef uint8_t* dst
    cap = check(dsz_sparseBound(rows, cols, rows * cols, 1), "sparseBound")
    dst = <uint8_t*>malloc(cap)
    if dst == NULL:
        raise MemoryError()
    try:
        with nogil:
            r = dsz_encodeSparseIndex(dst, cap, src, rows, cols, index_codec)
        check(r, "encodeSparseIndex")
        return take(dst, r)
    finally:
        free(dst)


def decode_sparse(dict info, const uint8_t[::1] data, const uint8_t[::1] index, float[::1] out):
    """Scatter a sparse frame's raw sections into out, which must be zero-filled."""
    cdef dsz_frameInfo f
    cdef size_t r, ds = data.shape[0], isz = index.shape[0], cap = out.shape[0]
    cdef const uint8_t* dp = &data[0] if ds else NULL
    cdef const uint8_t* ip = &index[0] if isz else NULL
    cdef float* dst = &out[0] if cap else NULL
    to_info(info, &f)
    with nogil:
        r = dsz_decodeSparse(dst, cap, &f, dp, ds, ip, isz)
    check(r, "sparse sections")


cdef class BytesWriter:
    """A new bytes object of n bytes, writable through the buffer protocol until it is taken.

    Decoding a model writes hundreds of megabytes that TFLite then wants as `bytes`; filling a
    fresh bytes object in place (as CPython's own constructors do before an object is shared)
    saves a copy of the whole model. Its initial contents are undefined: the caller fills every byte.
    """
    cdef bytes data
    cdef Py_ssize_t exports

    def __cinit__(self, Py_ssize_t n):
        if n < 0:
            raise ValueError("size must be >= 0")
        self.data = PyBytes_FromStringAndSize(NULL, n)

    def __getbuffer__(self, Py_buffer* view, int flags):
        if self.data is None:
            raise ValueError("the bytes were taken")
        PyBuffer_FillInfo(view, self, PyBytes_AS_STRING(self.data), len(self.data), 0, flags)
        self.exports += 1

    def __releasebuffer__(self, Py_buffer* view):
        self.exports -= 1

    def take(self):
        """The filled bytes object; every view of the writer must have been released."""
        if self.exports:
            raise ValueError("views of the bytes are still held")
        data, self.data = self.data, None
        return data


# ---- sparse matrix products (pydsz.model.sparse) ----

from libc.stdint cimport int32_t, int64_t

cdef extern from "dsz.h" nogil:
    size_t dsz_csrMatmul(float* y, size_t cap, const float* x, size_t n, size_t cols,
                         const int64_t* rowPtr, const int32_t* colIndex, const float* values,
                         size_t nnz, size_t rows, const float* bias)
    size_t dsz_csrFromDense(int64_t* rowPtr, int32_t* colIndex, float* values, size_t capacity,
                            const float* w, size_t rows, size_t cols)
    size_t dsz_decodeSparseCSR(int64_t* rowPtr, int32_t* colIndex, float* values, size_t nnzCapacity,
                               const dsz_frameInfo* info, const void* data, size_t dataSize,
                               const void* index, size_t indexSize)


def csr_matmul(const float[:, ::1] x, const int64_t[::1] row_ptr, const int32_t[::1] col_index,
               const float[::1] values, const float[::1] bias, float[:, ::1] out):
    """out[:] = x @ W.T + bias for W in CSR with len(row_ptr) - 1 rows and x.shape[1] columns
    (libdsz validates the CSR); bias may be empty (none)."""
    cdef size_t rows = row_ptr.shape[0] - 1 if row_ptr.shape[0] else 0
    cdef size_t r
    if row_ptr.shape[0] == 0 or out.shape[0] != x.shape[0] or <size_t>out.shape[1] != rows \
            or values.shape[0] != col_index.shape[0] or (bias.shape[0] and <size_t>bias.shape[0] != rows):
        raise ValueError(f"csr_matmul: x ({x.shape[0]}, {x.shape[1]}), {row_ptr.shape[0]} row pointers, "
                         f"{col_index.shape[0]} indices, {values.shape[0]} values, bias {bias.shape[0]}, "
                         f"out ({out.shape[0]}, {out.shape[1]}) do not fit together")
    if x.shape[0] == 0 or rows == 0:
        return
    cdef const float* b = &bias[0] if bias.shape[0] else NULL
    cdef const int32_t* ci = &col_index[0] if col_index.shape[0] else NULL
    cdef const float* vp = &values[0] if values.shape[0] else NULL
    with nogil:
        r = dsz_csrMatmul(&out[0, 0], out.shape[0] * out.shape[1], &x[0, 0], x.shape[0], x.shape[1],
                          &row_ptr[0], ci, vp, col_index.shape[0], rows, b)
    check(r, "csr_matmul")


def csr_from_dense(const float[:, ::1] w, int64_t[::1] row_ptr, int32_t[::1] col_index, float[::1] values):
    """Fill the CSR arrays (rows + 1 pointers, room for the non-zeros) from w; returns nnz."""
    cdef size_t r
    if <size_t>row_ptr.shape[0] != <size_t>w.shape[0] + 1 or values.shape[0] != col_index.shape[0]:
        raise ValueError(f"csr_from_dense: {row_ptr.shape[0]} row pointers for {w.shape[0]} rows, "
                         f"{col_index.shape[0]} indices, {values.shape[0]} values")
    cdef int32_t* ci = &col_index[0] if col_index.shape[0] else NULL
    cdef float* vp = &values[0] if values.shape[0] else NULL
    cdef const float* wp = &w[0, 0] if w.shape[0] and w.shape[1] else NULL
    with nogil:
        r = dsz_csrFromDense(&row_ptr[0], ci, vp, col_index.shape[0], wp, w.shape[0], w.shape[1])
    return check(r, "csr_from_dense")


def decode_sparse_csr(dict info, const uint8_t[::1] data, const uint8_t[::1] index, int64_t[::1] row_ptr,
                      int32_t[::1] col_index, float[::1] values):
    """Decode a sparse frame's raw sections into the CSR arrays (rows + 1 pointers, room for the
    non-zeros), with no dense matrix; returns nnz."""
    cdef dsz_frameInfo f
    cdef size_t r, ds = data.shape[0], isz = index.shape[0]
    cdef const uint8_t* dp = &data[0] if ds else NULL
    cdef const uint8_t* ip = &index[0] if isz else NULL
    cdef int32_t* ci = &col_index[0] if col_index.shape[0] else NULL
    cdef float* vp = &values[0] if values.shape[0] else NULL
    to_info(info, &f)
    if <size_t>row_ptr.shape[0] != <size_t>f.shape[0] + 1 or values.shape[0] != col_index.shape[0]:
        raise ValueError(f"decode_sparse_csr: {row_ptr.shape[0]} row pointers for {f.shape[0]} rows, "
                         f"{col_index.shape[0]} indices, {values.shape[0]} values")
    with nogil:
        r = dsz_decodeSparseCSR(&row_ptr[0], ci, vp, col_index.shape[0], &f, dp, ds, ip, isz)
    return check(r, "sparse sections")
