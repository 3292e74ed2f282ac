/* Fuzz target: the encoders against the decoders, on fuzzer-chosen data, dtype, bound,
 * radius, predictor and (sparse) index codec.
 * Input: flags (1 byte: bit 0 sparse, bits 1-2 predictor none/lorenzo/auto, bits 3-4 index
 * codec, bit 5 mode, bits 6-7 dtype float32/float16/int8/uint8), radius - 1 (1 byte), bound
 * exponent and mantissa (2 bytes; int8/uint8: k = the mantissa byte, the bound k + 1/2), shape
 * (1 byte), then the values' bit patterns (4, 2 or 1 bytes each, little-endian).
 * Checks: encoding into a buffer of the bound's size succeeds; it is deterministic (the same
 * bytes twice); every buffer one byte short of the frame is exactly DSZ_error_dstSize_tooSmall,
 * as is a destination one value short when decoding; the frame decodes to the header's sizes;
 * every finite value comes back within the bound, NaN and +-Inf bit for bit; in a sparse frame
 * zeros stay zero and non-zeros stay non-zero; the sparse frame's index section is what
 * dsz_encodeSparseIndex writes on its own. */
#include <math.h>
#include <stddef.h>
#include <stdint.h>

#include "common.h" /* dszi_f16_to_f32, to compare float16 values */
#include "fuzz_common.h"

#define HEADER 5

static unsigned pick_radius(uint8_t b)
{
    /* 1..256: the encoder walks a histogram and a code of 2 * radius symbols, which under
     * coverage tracing would make the default radius (32768) dominate the run time. The
     * decoders meet every radius in fuzz_array and fuzz_sparse. */
    return b + 1u;
}

static double pick_bound(uint8_t e, uint8_t m)
{
    if (e == 0) return 4.9406564584124654e-324; /* the least double: the step's inverse overflows */
    if (e == 255) return 1.7976931348623157e308; /* the step is capped */
    /* 2^-150 (below the least float) .. 2^104, then coarsely up to 2^944 */
    return ldexp(1.0 + m / 256.0, e < 240 ? (int)e - 151 : 104 + 60 * ((int)e - 240));
}

static int32_t bits_of(float f)
{
    int32_t u;
    memcpy(&u, &f, 4);
    return u;
}

/* a decoded value is acceptable for its input */
static void check_value(float x, float y, double eb, size_t i)
{
    if (isfinite(x))
        FUZZ_CHECK(fabs((double)x - (double)y) <= eb, "value %zu: %.9g decoded as %.9g, bound %g", i, x, y, eb);
    else
        FUZZ_CHECK(bits_of(x) == bits_of(y), "value %zu: %08x decoded as %08x", i, (unsigned)bits_of(x),
                   (unsigned)bits_of(y));
}

/* encode(cap) as a function of the capacity; the frame must fit cap and be the same each time */
typedef size_t (*encoder)(void* dst, size_t cap, const void* ctx);

static uint8_t* encode_checked(encoder enc, const void* ctx, size_t bound, size_t* size)
{
    uint8_t* const a = (uint8_t*)malloc(bound);
    uint8_t *b, *short_buf;
    size_t r, r2, s;
    FUZZ_CHECK(a != NULL, "out of memory");
    r = enc(a, bound, ctx);
    FUZZ_CHECK(!dsz_isError(r) && r <= bound, "encoding into the bound (%zu): %s", bound, dsz_getErrorName(r));
    b = (uint8_t*)malloc(r);
    FUZZ_CHECK(b != NULL, "out of memory");
    r2 = enc(b, r, ctx);
    FUZZ_CHECK(r2 == r && !memcmp(a, b, r), "encoding is not deterministic");
    free(b);
    /* one byte short, and (each one cheap to try) a header-sized and an empty buffer */
    for (s = 0; s < 3; s++) {
        size_t const cap = s == 0 ? r - 1 : s == 1 ? (r > 48 ? 48 : r - 1) : 0;
        short_buf = (uint8_t*)malloc(cap ? cap : 1);
        FUZZ_CHECK(short_buf != NULL, "out of memory");
        FUZZ_CHECK_ERROR(enc(short_buf, cap, ctx), DSZ_error_dstSize_tooSmall);
        free(short_buf);
    }
    *size = r;
    return a;
}

typedef struct {
    const float* x;
    unsigned long long shape[DSZ_MAX_NDIM];
    unsigned ndim;
    size_t rows, cols;
    dsz_params* p;
    double eb;       /* the error bound set in p */
    unsigned radius; /* and its radius */
    unsigned codec;
} job;

static size_t enc_array(void* dst, size_t cap, const void* ctx)
{
    const job* const j = (const job*)ctx;
    return dsz_compress(dst, cap, j->x, j->shape, j->ndim, j->p);
}

static size_t enc_sparse(void* dst, size_t cap, const void* ctx)
{
    const job* const j = (const job*)ctx;
    return dsz_encodeSparse(dst, cap, j->x, j->rows, j->cols, j->p, j->codec);
}

static void roundtrip_array(job* j, size_t n)
{
    dsz_frameInfo f;
    size_t size, hs, r, i;
    uint8_t* frame;
    float* y;
    unsigned d;
    frame = encode_checked(enc_array, j, dsz_compressBound(n, j->radius), &size);
    hs = dsz_getFrameInfo(&f, frame, size);
    FUZZ_CHECK(!dsz_isError(hs) && f.kind == DSZ_KIND_ARRAY && f.nElements == n && f.ndim == j->ndim,
               "frame header: %s", dsz_getErrorName(hs));
    for (d = 0; d < j->ndim; d++) FUZZ_CHECK(f.shape[d] == j->shape[d], "shape[%u]", d);
    FUZZ_CHECK(hs + f.dataStoredSize == size && f.errorBound == j->eb, "sizes or bound");
    y = fuzz_floats(n, 0);
    r = dsz_decompress(y, n, frame, size);
    FUZZ_CHECK(r == n, "decoded %s", dsz_getErrorName(r));
    for (i = 0; i < n; i++) check_value(j->x[i], y[i], j->eb, i);
    if (n) FUZZ_CHECK_ERROR(dsz_decompress(y, n - 1, frame, size), DSZ_error_dstSize_tooSmall);
    free(y);
    free(frame);
}

static void roundtrip_sparse(job* j)
{
    size_t const n = j->rows * j->cols;
    dsz_frameInfo f;
    size_t size, hs, r, i, nnz = 0, is;
    uint8_t *frame, *index;
    float* y;
    for (i = 0; i < n; i++) nnz += j->x[i] != 0.0f;
    frame = encode_checked(enc_sparse, j, dsz_sparseBound(j->rows, j->cols, nnz, j->radius), &size);
    hs = dsz_getFrameInfo(&f, frame, size);
    FUZZ_CHECK(!dsz_isError(hs) && f.kind == DSZ_KIND_SPARSE && f.nnz == nnz && f.shape[0] == j->rows &&
                   f.shape[1] == j->cols && f.indexCodec == j->codec,
               "frame header: %s", dsz_getErrorName(hs));
    FUZZ_CHECK(hs + f.dataStoredSize + f.indexStoredSize == size, "section sizes");
    y = fuzz_floats(n, 1);
    r = dsz_decodeSparse(y, n, &f, frame + hs, (size_t)f.dataRawSize, frame + hs + f.dataRawSize,
                         (size_t)f.indexRawSize);
    FUZZ_CHECK(r == nnz, "decoded %s", dsz_getErrorName(r));
    for (i = 0; i < n; i++) {
        if (j->x[i] == 0.0f) {
            FUZZ_CHECK(y[i] == 0.0f, "zero %zu decoded as %g", i, y[i]);
        } else {
            FUZZ_CHECK(y[i] != 0.0f, "non-zero %zu (%g) decoded as zero", i, j->x[i]);
            check_value(j->x[i], y[i], j->eb, i);
        }
    }
    if (n)
        FUZZ_CHECK_ERROR(dsz_decodeSparse(y, n - 1, &f, frame + hs, (size_t)f.dataRawSize,
                                          frame + hs + f.dataRawSize, (size_t)f.indexRawSize),
                         DSZ_error_dstSize_tooSmall);
    index = (uint8_t*)malloc(f.indexRawSize ? (size_t)f.indexRawSize : 1);
    FUZZ_CHECK(index != NULL, "out of memory");
    is = dsz_encodeSparseIndex(index, (size_t)f.indexRawSize, j->x, j->rows, j->cols, j->codec);
    FUZZ_CHECK(is == f.indexRawSize && !memcmp(index, frame + hs + f.dataRawSize, is),
               "dsz_encodeSparseIndex differs from the frame's index: %s", dsz_getErrorName(is));
    free(index);
    free(y);
    free(frame);
}

typedef struct {
    const uint8_t* raw; /* n values of dtype */
    unsigned dtype;
    job j;
} typed_job;

static size_t enc_typed_array(void* dst, size_t cap, const void* ctx)
{
    const typed_job* const t = (const typed_job*)ctx;
    return dsz_compressTyped(dst, cap, t->raw, t->dtype, t->j.shape, t->j.ndim, t->j.p);
}

static size_t enc_typed_sparse(void* dst, size_t cap, const void* ctx)
{
    const typed_job* const t = (const typed_job*)ctx;
    return dsz_encodeSparseTyped(dst, cap, t->raw, t->dtype, t->j.rows, t->j.cols, t->j.p, t->j.codec);
}

static float typed_value(const uint8_t* raw, unsigned dtype, size_t i)
{
    if (dtype == DSZ_DTYPE_FLOAT16) return dszi_f16_to_f32((uint32_t)raw[2 * i] | (uint32_t)raw[2 * i + 1] << 8);
    return dtype == DSZ_DTYPE_INT8 ? (float)(int8_t)raw[i] : (float)raw[i];
}

/* float16, int8, uint8: the same properties as float32, the bound checked in the stored dtype */
static void roundtrip_typed(typed_job* t, size_t n, int sparse)
{
    size_t const width = t->dtype == DSZ_DTYPE_FLOAT16 ? 2 : 1;
    dsz_frameInfo f;
    size_t size, hs, r, i, nnz = 0;
    uint8_t *frame, *y;
    for (i = 0; i < n; i++) nnz += typed_value(t->raw, t->dtype, i) != 0.0f;
    frame = sparse ? encode_checked(enc_typed_sparse, t, dsz_sparseBound(t->j.rows, t->j.cols, nnz, t->j.radius), &size)
                   : encode_checked(enc_typed_array, t, dsz_compressBound(n, t->j.radius), &size);
    hs = dsz_getFrameInfo(&f, frame, size);
    FUZZ_CHECK(!dsz_isError(hs) && f.dtype == t->dtype && f.version == 2 && f.nElements == n,
               "frame header: %s", dsz_getErrorName(hs));
    y = (uint8_t*)calloc(n ? n * width : 1, 1);
    FUZZ_CHECK(y != NULL, "out of memory");
    r = sparse ? dsz_decodeSparseTyped(y, n, &f, frame + hs, (size_t)f.dataRawSize, frame + hs + f.dataRawSize,
                                       (size_t)f.indexRawSize)
               : dsz_decompressArrayTyped(y, n, &f, frame + hs, (size_t)f.dataRawSize);
    FUZZ_CHECK(r == (sparse ? nnz : n), "decoded %s", dsz_getErrorName(r));
    for (i = 0; i < n; i++) {
        float const x = typed_value(t->raw, t->dtype, i), v = typed_value(y, t->dtype, i);
        if (sparse) FUZZ_CHECK((x == 0.0f) == (v == 0.0f), "value %zu: %g decoded as %g (zeros)", i, x, v);
        check_value(x, v, t->j.eb, i);
    }
    free(y);
    free(frame);
}

int LLVMFuzzerTestOneInput(const uint8_t* src, size_t size)
{
    static const unsigned preds[4] = {DSZ_PRED_NONE, DSZ_PRED_LORENZO, DSZ_PRED_AUTO, DSZ_PRED_AUTO};
    job j;
    size_t n, i;
    float* x;
    unsigned const pred = preds[(src[0] >> 1) & 3];
    unsigned mode;
    if (size < HEADER) return 0;
    memset(&j, 0, sizeof(j));
    j.codec = ((src[0] >> 3) & 3) % (DSZ_INDEX_BITMAP + 1);
    mode = (src[0] >> 5) & 1;
    j.radius = pick_radius(src[1]);
    j.eb = pick_bound(src[2], src[3]);
    if (src[0] >> 6) {
        typed_job t;
        t.dtype = DSZ_DTYPE_FLOAT32 + (src[0] >> 6);
        t.raw = src + HEADER;
        n = (size - HEADER) / (t.dtype == DSZ_DTYPE_FLOAT16 ? 2 : 1);
        if (t.dtype != DSZ_DTYPE_FLOAT16) j.eb = src[3] + 0.5;
        if (src[0] & 1) {
            j.cols = (size_t)src[4] % 64 + 1;
            j.rows = n / j.cols;
            n = j.rows * j.cols;
        } else {
            j.ndim = 1;
            j.shape[0] = n;
        }
        j.p = fuzz_params(j.eb, DSZ_MODE_ABS, pred, j.radius);
        t.j = j;
        roundtrip_typed(&t, n, src[0] & 1);
        dsz_freeParams(j.p);
        return 0;
    }
    n = (size - HEADER) / 4;
    x = fuzz_floats(n, 0);
    for (i = 0; i < n; i++) {
        uint32_t const u = (uint32_t)src[HEADER + 4 * i] | (uint32_t)src[HEADER + 4 * i + 1] << 8 |
                           (uint32_t)src[HEADER + 4 * i + 2] << 16 | (uint32_t)src[HEADER + 4 * i + 3] << 24;
        memcpy(x + i, &u, 4);
    }
    j.x = x;
    j.p = fuzz_params(j.eb, mode, pred, j.radius);
    if (src[0] & 1) {
        j.cols = (size_t)src[4] % 64 + 1;
        j.rows = n / j.cols;
        roundtrip_sparse(&j);
    } else {
        /* ndim 0 is a scalar; otherwise all n values go along one of the ndim axes */
        j.ndim = src[4] % (DSZ_MAX_NDIM + 1);
        if (j.ndim == 0 && n != 1) j.ndim = 1;
        for (i = 0; i < j.ndim; i++) j.shape[i] = 1;
        if (j.ndim) j.shape[(src[4] / (DSZ_MAX_NDIM + 1)) % j.ndim] = n;
        roundtrip_array(&j, n);
    }
    dsz_freeParams(j.p);
    free(x);
    return 0;
}
