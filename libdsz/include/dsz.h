/*
 * libdsz: error-bounded lossy compression of (pruned) neural-network weights.
 *
 * Portable C99, no dependencies. Every function that can fail returns a size_t
 * that is either a size or an error code: test it with dsz_isError(), name it
 * with dsz_getErrorName(). Output buffers are owned by the caller and sized
 * with the *Bound() functions. The library never prints and never aborts.
 *
 * Two levels, as zstd.h has them. The stable API below keeps its ABI: prototypes, enum values and
 * the layout of its few structs do not change, new functions and parameters are appended, and
 * encoder parameters live in an opaque object set one at a time (dsz_params_setParameter()).
 * The experimental API, declared only where DSZ_STATIC_LINKING_ONLY is defined before including
 * this header, works on frame sections through dsz_frameInfo, a struct that follows the frame
 * header and may gain fields with the format: link it statically (pydsz compiles libdsz in).
 *
 * Memory: dsz_createParams() mallocs the parameter object, which lives until dsz_freeParams().
 * dsz_compress(), dsz_encodeSparse() and dsz_encodeSparseIndex() malloc internal
 * scratch space (about 8 bytes per coded value, 1 byte per index symbol) and free it before
 * returning; dsz_decompressArray(), dsz_decodeSparse(), dsz_decodeSparseCSR() and
 * dsz_decompress() malloc decoding tables (8 KiB plus 8 bytes per used symbol, at most ~16 MiB
 * for the largest radius) and, for the bitmap index, two rows of flags (2 * cols bytes). All
 * are freed before returning.
 * dsz_csrMatmul() mallocs its scratch (about 520 bytes per row of W plus 2 MiB) and frees it.
 * All other functions allocate nothing.
 *
 * Threads: the library has no global state; any function may run on any number of threads at
 * once, given distinct output buffers. A dsz_params object may be shared by concurrent encoders
 * while no thread sets it.
 *
 * The byte format is specified in doc/format.md (format version DSZ_FORMAT_VERSION).
 */
#ifndef DSZ_H
#define DSZ_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- DSZ_API: the library's exported functions ----
 * A shared build compiles libdsz with -fvisibility=hidden (libdsz/Makefile): only the functions
 * marked DSZ_API, all declared in this header, are exported. On Windows define DSZ_DLL_EXPORT=1
 * when building the DLL and DSZ_DLL_IMPORT=1 when using it. */
#ifndef DSZ_VISIBLE
#if defined(__GNUC__) && (__GNUC__ >= 4) && !defined(__MINGW32__)
#define DSZ_VISIBLE __attribute__((visibility("default")))
#else
#define DSZ_VISIBLE
#endif
#endif

#if defined(DSZ_DLL_EXPORT) && (DSZ_DLL_EXPORT == 1)
#define DSZ_API __declspec(dllexport) DSZ_VISIBLE
#elif defined(DSZ_DLL_IMPORT) && (DSZ_DLL_IMPORT == 1)
#define DSZ_API __declspec(dllimport) DSZ_VISIBLE
#else
#define DSZ_API DSZ_VISIBLE
#endif

#define DSZ_VERSION_MAJOR 0
#define DSZ_VERSION_MINOR 1
#define DSZ_VERSION_PATCH 0
#define DSZ_VERSION_NUMBER (DSZ_VERSION_MAJOR * 10000 + DSZ_VERSION_MINOR * 100 + DSZ_VERSION_PATCH)
/* newest version of the byte format; decoders accept versions <= this one. Frames are written with
   the oldest version that holds them: 1 for float32, 2 for the other dtypes (doc/format.md) */
#define DSZ_FORMAT_VERSION 2

#define DSZ_MAX_NDIM 8
#define DSZ_RADIUS_DEFAULT 32768u
#define DSZ_RADIUS_MAX (1u << 20)
/* largest element count of one array or dense matrix (2^36 floats = 256 GiB) */
#define DSZ_MAX_ELEMENTS (1ull << 36)

/* predictors; DSZ_PRED_AUTO (parameter only) picks the smaller estimated stream */
#define DSZ_PRED_NONE 0u
#define DSZ_PRED_LORENZO 1u
#define DSZ_PRED_AUTO 255u

/* error-bound modes, informational: the stream always holds the absolute bound */
#define DSZ_MODE_ABS 0u
#define DSZ_MODE_REL 1u

/* lossless codecs that may wrap a section; libdsz itself reads only DSZ_LOSSLESS_NONE */
#define DSZ_LOSSLESS_NONE 0u
#define DSZ_LOSSLESS_ZSTD 1u
#define DSZ_LOSSLESS_LZMA 2u
#define DSZ_LOSSLESS_BZ2 3u
#define DSZ_LOSSLESS_ZLIB 4u

/* index codecs of the sparse stream */
#define DSZ_INDEX_GAP8 0u    /* DeepSZ: 8-bit gaps, 0 = skip 255 (meant for a lossless wrapper) */
#define DSZ_INDEX_HUFFGAP 1u /* the same gap symbols, canonical-Huffman coded */
#define DSZ_INDEX_BITMAP 2u  /* the non-zero bitmap, context-adaptive arithmetic coded */

/* element types of a frame (the stored dtype of a tensor) */
#define DSZ_DTYPE_FLOAT32 1u
#define DSZ_DTYPE_FLOAT16 2u /* IEEE binary16, little-endian */
#define DSZ_DTYPE_INT8 3u
#define DSZ_DTYPE_UINT8 4u

/* frame kinds */
#define DSZ_KIND_ARRAY 1u
#define DSZ_KIND_SPARSE 2u

/* stable error codes: values never change, new ones are appended */
typedef enum {
    DSZ_error_no_error = 0,
    DSZ_error_GENERIC = 1,
    DSZ_error_prefix_unknown = 10,
    DSZ_error_version_unsupported = 12,
    DSZ_error_frameParameter_unsupported = 14,
    DSZ_error_corruption_detected = 20,
    DSZ_error_parameter_unsupported = 40,
    DSZ_error_parameter_outOfBound = 42,
    DSZ_error_memory_allocation = 64,
    DSZ_error_dstSize_tooSmall = 70,
    DSZ_error_srcSize_wrong = 72,
    DSZ_error_maxCode = 120
} dsz_ErrorCode;

/* ---- errors ---- */

/* Tell whether a returned size is an error code. Returns 1 if error, 0 otherwise. */
DSZ_API unsigned dsz_isError(size_t code /* value returned by a dsz_ function */);

/* Name an error. Returns a static string, e.g. "DSZ_error_corruption_detected"; "No error" if none. */
DSZ_API const char* dsz_getErrorName(size_t code /* value returned by a dsz_ function */);

/* Convert a returned size into its stable error enum. Returns DSZ_error_no_error for non-errors. */
DSZ_API dsz_ErrorCode dsz_getErrorCode(size_t code /* value returned by a dsz_ function */);

/* Describe an error enum in words. Returns a static string. */
DSZ_API const char* dsz_getErrorString(dsz_ErrorCode code /* error enum */);

/* Library version. Returns DSZ_VERSION_NUMBER of the compiled library. */
DSZ_API unsigned dsz_versionNumber(void);

/* ---- encoder parameters ----
 * The encoders take their parameters as an opaque object, set one parameter at a time and each
 * checked as it is set, so that a parameter can be added without changing the ABI (zstd's
 * ZSTD_CCtx_setParameter() and ZSTD_cParam_getBounds()). Typical use:
 *     dsz_params* p = dsz_createParams();
 *     dsz_params_setParameter(p, dsz_p_errorBound, 1e-3);   (test each return with dsz_isError())
 *     ... dsz_compress(dst, cap, src, shape, ndim, p) ...
 *     dsz_freeParams(p);
 * Values are doubles for every parameter: an integer one takes an integral value, which a double
 * holds exactly. */

typedef struct dsz_params_s dsz_params;

/* parameter ids: values never change, new ones are appended */
typedef enum {
    dsz_p_errorBound = 1, /* absolute bound that every finite value decodes within: finite, > 0.
                             No default: an encoder given no bound returns DSZ_error_parameter_outOfBound */
    dsz_p_userBound = 2,  /* the user's bound as given (the relative one under DSZ_MODE_REL), stored
                             in the frame for information: finite. Default: the error bound */
    dsz_p_mode = 3,       /* DSZ_MODE_ABS (default) or DSZ_MODE_REL, stored for information */
    dsz_p_predictor = 4,  /* DSZ_PRED_NONE, DSZ_PRED_LORENZO or DSZ_PRED_AUTO (default) */
    dsz_p_radius = 5      /* quantization radius, 1..DSZ_RADIUS_MAX; 0 sets DSZ_RADIUS_DEFAULT (default).
                             The encoders lower it to 2^14 where it would make more distinct symbols than
                             the Huffman code holds (2^15); the frame records the radius used */
} dsz_parameter;

/* the values a parameter accepts */
typedef struct {
    size_t error;      /* 0, or an error code (test with dsz_isError()) */
    double lowerBound; /* smallest value accepted, inclusive */
    double upperBound; /* largest value accepted, inclusive */
} dsz_bounds;

/* Create a parameter object holding the defaults and no error bound. Mallocs it (a few dozen
 * bytes; free it with dsz_freeParams()). Returns the object, or NULL when out of memory. */
DSZ_API dsz_params* dsz_createParams(void);

/* Free a parameter object. Returns 0. */
DSZ_API size_t dsz_freeParams(dsz_params* params); /* from dsz_createParams(); NULL is accepted */

/* Set one parameter. An error leaves the object as it was.
 * Returns 0, or an error code: DSZ_error_parameter_outOfBound for a value outside
 * dsz_param_getBounds(param) or not integral where the parameter is an integer;
 * DSZ_error_parameter_unsupported for an unknown parameter, a mode or predictor id that names
 * none, or a NULL object. */
DSZ_API size_t dsz_params_setParameter(dsz_params* params,  /* from dsz_createParams() */
                                       dsz_parameter param, /* which parameter */
                                       double value);       /* its new value */

/* Read one parameter as the encoders use it: the radius resolved (never 0), the user bound
 * defaulted to the error bound, 0 for an error bound not yet set.
 * Returns 0, or an error code (DSZ_error_parameter_unsupported for an unknown parameter or a
 * NULL pointer). */
DSZ_API size_t dsz_params_getParameter(const dsz_params* params, /* from dsz_createParams() */
                                       dsz_parameter param,      /* which parameter */
                                       double* value);           /* receives its value */

/* The range of values a parameter accepts (for a mode or predictor, the smallest and largest id).
 * Returns the bounds; .error is DSZ_error_parameter_unsupported for an unknown parameter. */
DSZ_API dsz_bounds dsz_param_getBounds(dsz_parameter param /* which parameter */);

/* ---- array codec ---- */

/* Worst-case frame size for an array. Returns bytes, or an error if n is too large. */
DSZ_API size_t dsz_compressBound(size_t n,         /* number of float32 values */
                                 unsigned radius); /* quantization radius; 0 = DSZ_RADIUS_DEFAULT */

/* Compress a float32 array into a frame whose sections are stored raw (no lossless wrapper).
 * Every finite value decodes within the error bound; NaN, Inf and values that cannot be
 * quantized within the bound are stored verbatim. Mallocs scratch (~8 bytes per value).
 * Returns the frame size, or an error code. */
DSZ_API size_t dsz_compress(void* dst,                       /* output buffer */
                            size_t dstCapacity,              /* its size; dsz_compressBound(n, radius) suffices */
                            const float* src,                /* values in C order, n = product of shape */
                            const unsigned long long* shape, /* ndim extents (may be NULL if ndim == 0) */
                            unsigned ndim,                   /* 0..DSZ_MAX_NDIM */
                            const dsz_params* params);       /* bound, predictor, radius */

/* Decode a whole float32 array frame whose sections are stored raw (frames of other dtypes:
 * DSZ_error_frameParameter_unsupported). Mallocs a decoding table.
 * Returns the number of values written, or an error code. */
DSZ_API size_t dsz_decompress(float* dst,          /* output buffer */
                              size_t dstCapacity,  /* its capacity in values */
                              const void* src,     /* frame bytes */
                              size_t srcSize);     /* exact frame size */

/* ---- frames ---- */

/* what dsz_getFrameElementCount() returns for bytes that are not a valid frame header */
#define DSZ_ELEMENTCOUNT_ERROR (0ULL - 1)

/* The number of values a frame decodes to (the product of its shape; a sparse matrix's dense
 * size), read from its header alone, as zstd's ZSTD_getFrameContentSize(): enough to size the
 * output of dsz_decompress() before decoding. The header is checked as the decoders check it;
 * the sections are not read. Returns the count (at most DSZ_MAX_ELEMENTS), or
 * DSZ_ELEMENTCOUNT_ERROR where src does not start with a valid frame header. */
DSZ_API unsigned long long dsz_getFrameElementCount(const void* src,  /* frame bytes */
                                                    size_t srcSize);  /* at least the header */

/* ---- other stored dtypes (float16, int8, uint8) ----
 * The same codecs on values of another type: every decoded value is within errorBound of the
 * original after the rounding to the type (the encoder checks each one as it is rounded and
 * stores the value verbatim where the check fails). For int8 and uint8 the bound must be k + 0.5
 * with k in 0..255: every decoded integer is within k of the original (k = 0: lossless).
 * Values are little-endian, in the type's natural size; the scratch of the encoders grows by
 * 4 bytes per value (the values as floats). Their decoders are experimental (below). */

/* Compress an array of the given dtype. Returns the frame size, or an error code. */
DSZ_API size_t dsz_compressTyped(void* dst,                       /* output buffer */
                                 size_t dstCapacity,              /* dsz_compressBound(n, radius) suffices */
                                 const void* src,                 /* n values of dtype, C order */
                                 unsigned dtype,                  /* DSZ_DTYPE_* */
                                 const unsigned long long* shape, /* ndim extents */
                                 unsigned ndim,                   /* 0..DSZ_MAX_NDIM */
                                 const dsz_params* params);       /* bound, predictor, radius */

/* ---- sparse matrices ---- */

/* Worst-case sparse frame size. Returns bytes, or an error if the sizes are too large. */
DSZ_API size_t dsz_sparseBound(size_t rows,      /* matrix rows */
                               size_t cols,      /* matrix columns */
                               size_t nnz,       /* number of non-zeros (rows * cols is always safe) */
                               unsigned radius); /* quantization radius; 0 = DSZ_RADIUS_DEFAULT */

/* Encode a dense row-major float32 matrix as (data, index) of its non-zeros, sections raw.
 * Values equal to 0.0 or -0.0 are zeros; a non-zero never decodes to zero. Mallocs scratch.
 * Returns the frame size, or an error code. */
DSZ_API size_t dsz_encodeSparse(void* dst,                /* output buffer */
                                size_t dstCapacity,       /* dsz_sparseBound(rows, cols, nnz, radius) suffices */
                                const float* w,           /* rows * cols values, C order */
                                size_t rows,              /* matrix rows */
                                size_t cols,              /* matrix columns */
                                const dsz_params* params, /* bound, predictor, radius */
                                unsigned indexCodec);     /* DSZ_INDEX_* */

/* Encode a dense row-major matrix of the given dtype as (data, index) of its non-zeros (values
 * other than +-0). Returns the frame size, or an error code. */
DSZ_API size_t dsz_encodeSparseTyped(void* dst,                /* output buffer */
                                     size_t dstCapacity,       /* dsz_sparseBound(rows, cols, nnz, radius) suffices */
                                     const void* w,            /* rows * cols values of dtype, C order */
                                     unsigned dtype,           /* DSZ_DTYPE_* */
                                     size_t rows,              /* matrix rows */
                                     size_t cols,              /* matrix columns */
                                     const dsz_params* params, /* bound, predictor, radius */
                                     unsigned indexCodec);     /* DSZ_INDEX_* */

/* Encode only the index section of a matrix under an index codec (to compare codecs or swap
 * the section of a frame from dsz_encodeSparse()). Mallocs scratch. Returns bytes, or an error. */
DSZ_API size_t dsz_encodeSparseIndex(void* dst,            /* output buffer */
                                     size_t dstCapacity,   /* dsz_sparseBound(rows, cols, nnz, 1) suffices */
                                     const float* w,       /* rows * cols values, C order */
                                     size_t rows,          /* matrix rows */
                                     size_t cols,          /* matrix columns */
                                     unsigned indexCodec); /* DSZ_INDEX_* */

/* ---- sparse matrix products (evaluating pruned FC layers) ---- */

/* Y = X @ W^T (+ bias) for a CSR matrix W [rows, cols] and a dense row-major X [n, cols]: what a
 * FULLY_CONNECTED layer computes, at the cost of the non-zeros only. Every output is summed in the
 * same order (the row's non-zeros by column, then the bias) however the caller splits the samples,
 * so the result does not depend on the split; it is not BLAS's order, so it differs from a dense
 * product by float rounding. Validates the CSR first (O(rows + nnz)): row pointers from 0 to nnz,
 * non-decreasing; column indices in [0, cols) and increasing along each row. Single-threaded; the
 * caller may run disjoint sample ranges on several threads. Mallocs 128 * (rows + 4096) floats
 * and rows size_t of scratch, freed before returning.
 * Returns n * rows (the values written), or an error code. */
DSZ_API size_t dsz_csrMatmul(float* y,                /* output [n, rows], row-major */
                             size_t yCapacity,        /* capacity of y in values, >= n * rows */
                             const float* x,          /* input [n, cols], row-major */
                             size_t n,                /* samples */
                             size_t cols,             /* columns of W = values per sample, <= 2^31 */
                             const int64_t* rowPtr,   /* rows + 1 offsets into colIndex and values */
                             const int32_t* colIndex, /* nnz column indices */
                             const float* values,     /* nnz values */
                             size_t nnz,              /* number of stored values */
                             size_t rows,             /* rows of W = outputs per sample */
                             const float* bias);      /* rows values added to each output, or NULL */

/* The CSR form of a dense row-major matrix: its non-zeros (values other than +-0) row by row,
 * columns increasing, as dsz_csrMatmul() takes them. Allocates nothing.
 * Returns nnz, or an error code (DSZ_error_dstSize_tooSmall when more than capacity non-zeros). */
DSZ_API size_t dsz_csrFromDense(int64_t* rowPtr,   /* output, rows + 1 offsets */
                                int32_t* colIndex, /* output, capacity column indices */
                                float* values,     /* output, capacity values */
                                size_t capacity,   /* room in colIndex and values */
                                const float* w,    /* rows * cols values, C order */
                                size_t rows,       /* matrix rows */
                                size_t cols);      /* matrix columns, <= 2^31 */

#ifdef __cplusplus
}
#endif
#endif /* DSZ_H */

/* ======================================================================================
 * Experimental API: frame sections through dsz_frameInfo, for static linking only.
 * dsz_frameInfo follows the frame header (doc/format.md) and gains fields when the format does,
 * so its layout and these prototypes may change in any release. Define DSZ_STATIC_LINKING_ONLY
 * before including dsz.h to declare them, and link libdsz statically. They are what a caller
 * needs to wrap sections losslessly, as pydsz does, and to decode sparse frames and the frames
 * of other dtypes.
 * ====================================================================================== */
#if defined(DSZ_STATIC_LINKING_ONLY) && !defined(DSZ_H_STATIC_LINKING_ONLY)
#define DSZ_H_STATIC_LINKING_ONLY

#ifdef __cplusplus
extern "C" {
#endif

/* A parsed frame header (array or sparse). */
typedef struct {
    unsigned kind;       /* DSZ_KIND_ARRAY or DSZ_KIND_SPARSE */
    unsigned version;    /* format version of the frame */
    unsigned dtype;      /* DSZ_DTYPE_* */
    unsigned ndim;       /* array: 0..DSZ_MAX_NDIM; sparse: 2 */
    unsigned predictor;  /* DSZ_PRED_NONE or DSZ_PRED_LORENZO */
    unsigned mode;       /* DSZ_MODE_ABS or DSZ_MODE_REL */
    unsigned radius;     /* quantization radius */
    unsigned indexCodec; /* sparse: DSZ_INDEX_*; array: 0 */
    unsigned dataLossless;  /* DSZ_LOSSLESS_* wrapping the data section */
    unsigned indexLossless; /* DSZ_LOSSLESS_* wrapping the index section (sparse) */
    double errorBound;   /* absolute bound */
    double userBound;    /* user's bound as given */
    unsigned long long shape[DSZ_MAX_NDIM]; /* array shape; sparse: rows, cols */
    unsigned long long nElements;  /* product of the shape (dense size of a sparse matrix) */
    unsigned long long nnz;        /* sparse: number of non-zeros; array: nElements */
    unsigned long long dataRawSize;     /* data section size once unwrapped */
    unsigned long long dataStoredSize;  /* data section size as stored */
    unsigned long long indexRawSize;    /* index section size once unwrapped (sparse) */
    unsigned long long indexStoredSize; /* index section size as stored (sparse) */
    size_t headerSize;   /* bytes of the header; the data section follows, then the index section */
} dsz_frameInfo;

/* ---- frame headers ---- */

/* Parse and validate a frame header (array or sparse). Checks magic, version, reserved fields,
 * shape overflow and declared section sizes against limits. Allocates nothing.
 * Returns the header size, or an error code. */
DSZ_API size_t dsz_getFrameInfo(dsz_frameInfo* info, /* filled on success */
                                const void* src,     /* frame bytes (at least the header) */
                                size_t srcSize);     /* bytes available */

/* Write a frame header for the given description (used to re-wrap sections losslessly).
 * Returns the header size, or an error code. */
DSZ_API size_t dsz_writeFrameHeader(void* dst,                  /* output buffer */
                                    size_t dstCapacity,         /* its size (<= 112 bytes needed) */
                                    const dsz_frameInfo* info); /* header fields; headerSize is ignored */

/* ---- array sections ---- */

/* Decode a float32 array frame's data section (already unwrapped, i.e. raw) into dst
 * (frames of other dtypes: DSZ_error_frameParameter_unsupported, see dsz_decompressArrayTyped).
 * Mallocs a decoding table. Returns the number of values written, or an error code. */
DSZ_API size_t dsz_decompressArray(float* dst,                /* output, info->nElements values */
                                   size_t dstCapacity,        /* capacity of dst in values */
                                   const dsz_frameInfo* info, /* from dsz_getFrameInfo() */
                                   const void* data,          /* raw data section */
                                   size_t dataSize);          /* must equal info->dataRawSize */

/* Decode an array frame's raw data section into dst as the frame's dtype (info->dtype).
 * Returns the number of values written, or an error code. */
DSZ_API size_t dsz_decompressArrayTyped(void* dst,                 /* output, info->nElements values */
                                        size_t dstCapacity,        /* capacity of dst in values of info->dtype */
                                        const dsz_frameInfo* info, /* from dsz_getFrameInfo() */
                                        const void* data,          /* raw data section */
                                        size_t dataSize);          /* must equal info->dataRawSize */

/* ---- sparse sections ---- */

/* Apply an update's difference to a layer: dst[i] = base[i] + the i-th value of a float32 array
 * frame, in one pass (pydsz's model updates code each layer's difference from the weights a device
 * holds; doc/format.md). dst may be base itself. Mallocs a decoding table.
 * Returns info->nElements, or an error code (the dst values are then unspecified). */
DSZ_API size_t dsz_decodeArrayDelta(float* dst,                /* output, info->nElements values */
                                    size_t dstCapacity,        /* its capacity in values */
                                    const float* base,         /* info->nElements values to add to */
                                    const dsz_frameInfo* info, /* from dsz_getFrameInfo() */
                                    const void* data,          /* the raw data section */
                                    size_t dataSize);          /* info->dataRawSize */

/* Rebuild a dense float32 matrix from a sparse frame's raw sections in one pass: index decoding,
 * data decoding, dequantization and scatter fused. dst MUST be zero-filled by the caller
 * (e.g. calloc); only non-zero positions are written. Mallocs decoding tables.
 * Returns nnz, or an error code. */
DSZ_API size_t dsz_decodeSparse(float* dst,                /* output, info->nElements values, zero-filled */
                                size_t dstCapacity,        /* capacity of dst in values */
                                const dsz_frameInfo* info, /* from dsz_getFrameInfo() */
                                const void* data,          /* raw data section */
                                size_t dataSize,           /* must equal info->dataRawSize */
                                const void* index,         /* raw index section */
                                size_t indexSize);         /* must equal info->indexRawSize */

/* Rebuild a dense matrix of the frame's dtype from a sparse frame's raw sections in one pass.
 * dst MUST be zero-filled. Returns nnz, or an error code. */
DSZ_API size_t dsz_decodeSparseTyped(void* dst,                 /* output, info->nElements values, zero-filled */
                                     size_t dstCapacity,        /* capacity of dst in values of info->dtype */
                                     const dsz_frameInfo* info, /* from dsz_getFrameInfo() */
                                     const void* data,          /* raw data section */
                                     size_t dataSize,           /* must equal info->dataRawSize */
                                     const void* index,         /* raw index section */
                                     size_t indexSize);         /* must equal info->indexRawSize */

/* Decode a sparse frame's raw sections straight into CSR form, with no dense matrix: exactly what
 * dsz_csrFromDense() gives for the matrix dsz_decodeSparseTyped() decodes, the values as float32
 * whatever the frame's dtype (float16, int8 and uint8 widened exactly). Every one of the stream's
 * nnz non-zeros is an entry (the encoder never lets a non-zero decode to zero). Validates the
 * sections as dsz_decodeSparseTyped() does; on an error the outputs hold partial results.
 * Mallocs the same decoding tables. Returns nnz, or an error code (DSZ_error_parameter_outOfBound
 * for more than 2^31 columns, DSZ_error_dstSize_tooSmall when nnzCapacity < info->nnz). */
DSZ_API size_t dsz_decodeSparseCSR(int64_t* rowPtr,           /* output, info->shape[0] + 1 offsets */
                                   int32_t* colIndex,         /* output, nnzCapacity column indices */
                                   float* values,             /* output, nnzCapacity values */
                                   size_t nnzCapacity,        /* room in colIndex and values, >= info->nnz */
                                   const dsz_frameInfo* info, /* from dsz_getFrameInfo() */
                                   const void* data,          /* raw data section */
                                   size_t dataSize,           /* must equal info->dataRawSize */
                                   const void* index,         /* raw index section */
                                   size_t indexSize);         /* must equal info->indexRawSize */

#ifdef __cplusplus
}
#endif
#endif /* DSZ_STATIC_LINKING_ONLY */
