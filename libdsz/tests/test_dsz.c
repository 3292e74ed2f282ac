/* Unit tests of libdsz: plain asserts through CHECK, no framework. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "dsz.h"

static int failures = 0;
#define CHECK(cond)                                                          \
    do {                                                                     \
        if (!(cond)) {                                                       \
            fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond); \
            failures++;                                                      \
        }                                                                    \
    } while (0)

static uint64_t rng_state = 88172645463325252ull;
static uint64_t rnd(void)
{
    rng_state ^= rng_state << 13; rng_state ^= rng_state >> 7; rng_state ^= rng_state << 17;
    return rng_state;
}
static double unif(void) { return (double)(rnd() >> 11) / 9007199254740992.0; }
static float laplace(double scale)
{
    double const u = unif() - 0.5;
    return (float)(-scale * (u < 0 ? -1 : 1) * log(1 - 2 * fabs(u) + 1e-300));
}

/* one parameter object for the whole run, set afresh by each params_radius() (freed by main) */
static dsz_params* shared_params;

/* the parameter object set to the bound eb (user bound eb, mode abs), predictor and radius */
static const dsz_params* params_radius(double eb, unsigned predictor, unsigned radius)
{
    if (!shared_params) shared_params = dsz_createParams();
    if (!shared_params) { fprintf(stderr, "out of memory\n"); exit(1); }
    CHECK(dsz_params_setParameter(shared_params, dsz_p_errorBound, eb) == 0);
    CHECK(dsz_params_setParameter(shared_params, dsz_p_userBound, eb) == 0);
    CHECK(dsz_params_setParameter(shared_params, dsz_p_mode, DSZ_MODE_ABS) == 0);
    CHECK(dsz_params_setParameter(shared_params, dsz_p_predictor, predictor) == 0);
    CHECK(dsz_params_setParameter(shared_params, dsz_p_radius, radius) == 0);
    return shared_params;
}

static const dsz_params* params(double eb, unsigned predictor) { return params_radius(eb, predictor, 0); }

static int same_bits(float a, float b) { return memcmp(&a, &b, 4) == 0; }

static int within(const float* x, const float* y, size_t n, double eb)
{
    size_t i;
    for (i = 0; i < n; i++) {
        if (isfinite(x[i])) { if (!(fabs((double)x[i] - (double)y[i]) <= eb)) return 0; }
        else if (!same_bits(x[i], y[i])) return 0;
    }
    return 1;
}

static void test_errors(void)
{
    size_t const e = DSZI_ERROR(corruption_detected);
    CHECK(dsz_isError(e));
    CHECK(!dsz_isError(0) && !dsz_isError(12345));
    CHECK(dsz_getErrorCode(e) == DSZ_error_corruption_detected);
    CHECK(!strcmp(dsz_getErrorName(e), "DSZ_error_corruption_detected"));
    CHECK(!strcmp(dsz_getErrorName(0), "No error"));
    CHECK(dsz_getErrorString(DSZ_error_srcSize_wrong) != NULL);
    CHECK(dsz_versionNumber() == DSZ_VERSION_NUMBER);
}

/* compress, check the bound, then every truncation and some bit flips must fail cleanly */
static void round_trip(const float* x, size_t n, double eb, unsigned predictor, int abuse)
{
    unsigned long long shape[1];
    size_t const cap = dsz_compressBound(n, 0);
    uint8_t* buf = (uint8_t*)malloc(cap);
    float* y = (float*)malloc(sizeof(float) * (n + 1));
    const dsz_params* const p = params(eb, predictor);
    size_t csize, r, k;
    shape[0] = n;
    CHECK(!dsz_isError(cap));
    csize = dsz_compress(buf, cap, x, shape, 1, p);
    CHECK(!dsz_isError(csize));
    if (dsz_isError(csize)) { free(buf); free(y); return; }
    r = dsz_decompress(y, n, buf, csize);
    CHECK(r == n);
    CHECK(within(x, y, n, eb));
    CHECK(dsz_getErrorCode(dsz_decompress(y, n ? n - 1 : 0, buf, csize)) == (n ? DSZ_error_dstSize_tooSmall : DSZ_error_no_error));
    if (abuse) {
        for (k = 0; k < csize; k++) CHECK(dsz_isError(dsz_decompress(y, n, buf, k)));
        for (k = 0; k < 8 * csize; k++) {
            buf[k / 8] ^= (uint8_t)(1u << (k % 8));
            (void)dsz_decompress(y, n, buf, csize); /* any result, but no crash (ASan/UBSan watch) */
            buf[k / 8] ^= (uint8_t)(1u << (k % 8));
        }
    }
    free(buf);
    free(y);
}

static void test_arrays(void)
{
    size_t const n = 20000;
    float* x = (float*)malloc(sizeof(float) * n);
    size_t i;
    static const float special[] = {0.0f, -0.0f, 1e-45f, -1e-45f, 1.17e-38f, 3.4028235e38f, -3.4028235e38f,
                                    1.0f, -1.0f, 123456.7f, 1e-30f};
    float odd[16];
    uint32_t const nanbits[3] = {0x7FC01234u, 0xFF800001u, 0x7F800000u};
    static const double ebs[] = {1e-320, 1e-45, 1e-30, 1e-6, 1e-2, 1.0, 1e30, 1e38, 1e300, 1.7e308};
    for (i = 0; i < n; i++) x[i] = laplace(0.05);
    round_trip(x, n, 1e-3, DSZ_PRED_NONE, 0);
    round_trip(x, n, 1e-3, DSZ_PRED_LORENZO, 0);
    round_trip(x, n, 1e-2, DSZ_PRED_AUTO, 0);
    round_trip(x, 0, 1e-2, DSZ_PRED_AUTO, 1);
    round_trip(x, 1, 1e-2, DSZ_PRED_AUTO, 1);
    round_trip(x, 40, 1e-2, DSZ_PRED_NONE, 1);
    round_trip(x, 40, 1e-2, DSZ_PRED_LORENZO, 1);
    memcpy(odd, special, sizeof(special));
    for (i = 0; i < 3; i++) memcpy(odd + 11 + i, nanbits + i, 4);
    odd[14] = -INFINITY; odd[15] = 2.5f;
    for (i = 0; i < sizeof(ebs) / sizeof(ebs[0]); i++) {
        round_trip(odd, 16, ebs[i], DSZ_PRED_NONE, 0);
        round_trip(odd, 16, ebs[i], DSZ_PRED_LORENZO, 0);
    }
    round_trip(odd, 16, 1e-3, DSZ_PRED_AUTO, 1);
    free(x);
    {   /* a bound tiny beside the values: more distinct symbols than the Huffman code holds (2^15), so
           the encoder quantizes within a radius of 2^14, the frame saying so */
        size_t const m = 200000;
        float* y = (float*)malloc(sizeof(float) * m);
        uint8_t* buf = (uint8_t*)malloc(dsz_compressBound(m, 0));
        dsz_frameInfo f;
        size_t csize;
        unsigned long long shape[1];
        shape[0] = m;
        for (i = 0; i < m; i++) y[i] = laplace(0.05);
        round_trip(y, m, 2e-6, DSZ_PRED_NONE, 0);
        round_trip(y, m, 2e-6, DSZ_PRED_LORENZO, 0);
        csize = dsz_compress(buf, dsz_compressBound(m, 0), y, shape, 1, params(2e-6, DSZ_PRED_NONE));
        CHECK(!dsz_isError(csize) && !dsz_isError(dsz_getFrameInfo(&f, buf, csize)) && f.radius == 1u << 14);
        free(buf);
        free(y);
    }
}

/* the values an encoder cannot take are refused as they are set, with the codes the encoders gave
   them when the parameters were a struct, and leave the object as it was */
static void test_bad_params(void)
{
    float x[4] = {1, 2, 3, 4};
    unsigned long long shape[1] = {4};
    uint8_t buf[512];
    dsz_params* const p = dsz_createParams();
    double v = -1;
    CHECK(p != NULL);
    if (!p) return;
    /* no bound yet, or no object: the encoders refuse */
    CHECK(dsz_getErrorCode(dsz_compress(buf, sizeof(buf), x, shape, 1, p)) == DSZ_error_parameter_outOfBound);
    CHECK(dsz_getErrorCode(dsz_encodeSparse(buf, sizeof(buf), x, 2, 2, p, DSZ_INDEX_GAP8)) == DSZ_error_parameter_outOfBound);
    CHECK(dsz_getErrorCode(dsz_compress(buf, sizeof(buf), x, shape, 1, NULL)) == DSZ_error_parameter_unsupported);
    CHECK(dsz_getErrorCode(dsz_params_setParameter(p, dsz_p_errorBound, 0.0)) == DSZ_error_parameter_outOfBound);
    CHECK(dsz_getErrorCode(dsz_params_setParameter(p, dsz_p_errorBound, -1e-3)) == DSZ_error_parameter_outOfBound);
    CHECK(dsz_getErrorCode(dsz_params_setParameter(p, dsz_p_errorBound, NAN)) == DSZ_error_parameter_outOfBound);
    CHECK(dsz_getErrorCode(dsz_params_setParameter(p, dsz_p_errorBound, INFINITY)) == DSZ_error_parameter_outOfBound);
    CHECK(dsz_getErrorCode(dsz_params_setParameter(p, dsz_p_userBound, NAN)) == DSZ_error_parameter_outOfBound);
    CHECK(dsz_getErrorCode(dsz_params_setParameter(p, dsz_p_userBound, -INFINITY)) == DSZ_error_parameter_outOfBound);
    CHECK(dsz_getErrorCode(dsz_params_setParameter(p, dsz_p_predictor, 7)) == DSZ_error_parameter_unsupported);
    CHECK(dsz_getErrorCode(dsz_params_setParameter(p, dsz_p_predictor, 0.5)) == DSZ_error_parameter_unsupported);
    CHECK(dsz_getErrorCode(dsz_params_setParameter(p, dsz_p_mode, 2)) == DSZ_error_parameter_unsupported);
    CHECK(dsz_getErrorCode(dsz_params_setParameter(p, dsz_p_radius, DSZ_RADIUS_MAX + 1)) == DSZ_error_parameter_outOfBound);
    CHECK(dsz_getErrorCode(dsz_params_setParameter(p, dsz_p_radius, -1)) == DSZ_error_parameter_outOfBound);
    CHECK(dsz_getErrorCode(dsz_params_setParameter(p, dsz_p_radius, 2.5)) == DSZ_error_parameter_outOfBound);
    CHECK(dsz_getErrorCode(dsz_params_setParameter(p, dsz_p_radius, NAN)) == DSZ_error_parameter_outOfBound);
    CHECK(dsz_getErrorCode(dsz_params_setParameter(p, (dsz_parameter)99, 1)) == DSZ_error_parameter_unsupported);
    CHECK(dsz_getErrorCode(dsz_params_setParameter(NULL, dsz_p_radius, 1)) == DSZ_error_parameter_unsupported);
    CHECK(dsz_getErrorCode(dsz_params_getParameter(p, (dsz_parameter)0, &v)) == DSZ_error_parameter_unsupported);
    CHECK(dsz_getErrorCode(dsz_params_getParameter(p, dsz_p_radius, NULL)) == DSZ_error_parameter_unsupported);
    /* none of them changed the defaults */
    CHECK(dsz_params_getParameter(p, dsz_p_errorBound, &v) == 0 && v == 0);
    CHECK(dsz_params_getParameter(p, dsz_p_userBound, &v) == 0 && v == 0);
    CHECK(dsz_params_getParameter(p, dsz_p_mode, &v) == 0 && v == DSZ_MODE_ABS);
    CHECK(dsz_params_getParameter(p, dsz_p_predictor, &v) == 0 && v == DSZ_PRED_AUTO);
    CHECK(dsz_params_getParameter(p, dsz_p_radius, &v) == 0 && v == DSZ_RADIUS_DEFAULT);
    CHECK(dsz_params_setParameter(p, dsz_p_errorBound, 1e-3) == 0);
    CHECK(dsz_params_setParameter(p, dsz_p_predictor, DSZ_PRED_NONE) == 0);
    CHECK(dsz_getErrorCode(dsz_compress(buf, 20, x, shape, 1, p)) == DSZ_error_dstSize_tooSmall);
    CHECK(dsz_getErrorCode(dsz_compress(buf, 60, x, shape, 1, p)) == DSZ_error_dstSize_tooSmall);
    dsz_freeParams(p);
}

/* the bounds each parameter reports are accepted, and the frame records what was set */
static void test_params(void)
{
    float x[4] = {1, 2, 3, 4};
    unsigned long long shape[1] = {4};
    uint8_t buf[512];
    dsz_params* const p = dsz_createParams();
    dsz_frameInfo f;
    dsz_bounds b;
    double v = -1;
    size_t cs;
    CHECK(p != NULL);
    if (!p) return;
    b = dsz_param_getBounds(dsz_p_errorBound);
    CHECK(b.error == 0 && b.lowerBound > 0 && b.lowerBound == DBL_MIN * DBL_EPSILON && b.upperBound == DBL_MAX);
    CHECK(dsz_params_setParameter(p, dsz_p_errorBound, b.lowerBound) == 0);
    CHECK(dsz_params_setParameter(p, dsz_p_errorBound, b.upperBound) == 0);
    b = dsz_param_getBounds(dsz_p_userBound);
    CHECK(b.error == 0 && b.lowerBound == -DBL_MAX && b.upperBound == DBL_MAX);
    b = dsz_param_getBounds(dsz_p_mode);
    CHECK(b.error == 0 && b.lowerBound == DSZ_MODE_ABS && b.upperBound == DSZ_MODE_REL);
    b = dsz_param_getBounds(dsz_p_predictor);
    CHECK(b.error == 0 && b.lowerBound == DSZ_PRED_NONE && b.upperBound == DSZ_PRED_AUTO);
    b = dsz_param_getBounds(dsz_p_radius);
    CHECK(b.error == 0 && b.lowerBound == 0 && b.upperBound == DSZ_RADIUS_MAX);
    CHECK(dsz_params_setParameter(p, dsz_p_radius, b.upperBound) == 0);
    CHECK(dsz_params_getParameter(p, dsz_p_radius, &v) == 0 && v == DSZ_RADIUS_MAX);
    CHECK(dsz_params_setParameter(p, dsz_p_radius, b.lowerBound) == 0); /* 0: the default */
    CHECK(dsz_params_getParameter(p, dsz_p_radius, &v) == 0 && v == DSZ_RADIUS_DEFAULT);
    CHECK(dsz_getErrorCode(dsz_param_getBounds((dsz_parameter)0).error) == DSZ_error_parameter_unsupported);
    /* the user bound follows the error bound until it is set */
    CHECK(dsz_params_setParameter(p, dsz_p_errorBound, 0.25) == 0);
    CHECK(dsz_params_getParameter(p, dsz_p_userBound, &v) == 0 && v == 0.25);
    cs = dsz_compress(buf, sizeof(buf), x, shape, 1, p);
    CHECK(!dsz_isError(dsz_getFrameInfo(&f, buf, cs)));
    CHECK(f.errorBound == 0.25 && f.userBound == 0.25 && f.mode == DSZ_MODE_ABS && f.radius == DSZ_RADIUS_DEFAULT);
    CHECK(dsz_params_setParameter(p, dsz_p_userBound, 0.01) == 0);
    CHECK(dsz_params_setParameter(p, dsz_p_mode, DSZ_MODE_REL) == 0);
    CHECK(dsz_params_setParameter(p, dsz_p_predictor, DSZ_PRED_LORENZO) == 0);
    CHECK(dsz_params_setParameter(p, dsz_p_radius, 100) == 0);
    CHECK(dsz_params_setParameter(p, dsz_p_errorBound, 0.5) == 0);
    CHECK(dsz_params_getParameter(p, dsz_p_userBound, &v) == 0 && v == 0.01);
    cs = dsz_compress(buf, sizeof(buf), x, shape, 1, p);
    CHECK(!dsz_isError(dsz_getFrameInfo(&f, buf, cs)));
    CHECK(f.errorBound == 0.5 && f.userBound == 0.01 && f.mode == DSZ_MODE_REL && f.radius == 100);
    CHECK(f.predictor == DSZ_PRED_LORENZO);
    CHECK(dsz_freeParams(p) == 0 && dsz_freeParams(NULL) == 0);
}

static void test_header(void)
{
    float x[6] = {1, 2, 3, 4, 5, 6};
    unsigned long long shape[2] = {2, 3};
    uint8_t buf[4096];
    const dsz_params* const p = params(1e-3, DSZ_PRED_NONE);
    dsz_frameInfo f;
    size_t const cs = dsz_compress(buf, sizeof(buf), x, shape, 2, p);
    size_t hs;
    CHECK(!dsz_isError(cs));
    hs = dsz_getFrameInfo(&f, buf, cs);
    CHECK(hs == 64 && f.kind == DSZ_KIND_ARRAY && f.nElements == 6 && f.shape[1] == 3);
    CHECK(f.errorBound == 1e-3 && f.dataRawSize == cs - hs);
    CHECK(dsz_getFrameElementCount(buf, cs) == 6 && dsz_getFrameElementCount(buf, hs) == 6);
    CHECK(dsz_getFrameElementCount(buf, hs - 1) == DSZ_ELEMENTCOUNT_ERROR);
    CHECK(dsz_getFrameElementCount(NULL, cs) == DSZ_ELEMENTCOUNT_ERROR);
    buf[0] = 'X';
    CHECK(dsz_getFrameElementCount(buf, cs) == DSZ_ELEMENTCOUNT_ERROR);
    CHECK(dsz_getErrorCode(dsz_getFrameInfo(&f, buf, cs)) == DSZ_error_prefix_unknown);
    buf[0] = 'D';
    buf[4] = DSZ_FORMAT_VERSION + 1;
    CHECK(dsz_getErrorCode(dsz_getFrameInfo(&f, buf, cs)) == DSZ_error_version_unsupported);
    buf[4] = 1;
    buf[5] = DSZ_DTYPE_FLOAT16; /* float16 came with version 2: a version-1 frame cannot hold it */
    CHECK(dsz_getErrorCode(dsz_getFrameInfo(&f, buf, cs)) == DSZ_error_corruption_detected);
    buf[5] = 9;
    CHECK(dsz_getErrorCode(dsz_getFrameInfo(&f, buf, cs)) == DSZ_error_frameParameter_unsupported);
    buf[5] = DSZ_DTYPE_FLOAT32;
    buf[11] = 1;
    CHECK(dsz_getErrorCode(dsz_getFrameInfo(&f, buf, cs)) == DSZ_error_corruption_detected);
    buf[11] = 0;
    /* shape whose product overflows */
    dszi_wr64(buf + 48, 1ull << 40);
    dszi_wr64(buf + 56, 1ull << 40);
    CHECK(dsz_getErrorCode(dsz_getFrameInfo(&f, buf, cs)) == DSZ_error_corruption_detected);
    /* 2^32 values: a count the format allows, more than a 32-bit build can address (refused as
     * unsupported there); a 64-bit build finds the data section too short for them */
    dszi_wr64(buf + 48, 1ull << 16);
    dszi_wr64(buf + 56, 1ull << 16);
    CHECK(dsz_getErrorCode(dsz_getFrameInfo(&f, buf, cs)) ==
          (sizeof(size_t) < 8 ? DSZ_error_frameParameter_unsupported : DSZ_error_corruption_detected));
}

static size_t table(uint8_t* t, unsigned maxLen, uint32_t lo, const unsigned* lens, uint32_t count)
{
    uint32_t i;
    memset(t, 0, 64);
    t[0] = (uint8_t)maxLen;
    t[1] = 0;
    dszi_wr32(t + 2, lo);
    dszi_wr32(t + 6, lo + count - 1);
    for (i = 0; i < count; i++) t[10 + i / 2] |= (uint8_t)(lens[i] << ((i & 1) ? 0 : 4));
    return 10 + (count + 1) / 2;
}

static void test_huffman_tables(void)
{
    uint8_t t[64];
    dszi_hufDec d;
    static const unsigned complete[] = {1, 2, 3, 3};
    static const unsigned over[] = {1, 2, 2, 3};
    static const unsigned incomplete[] = {1, 2, 3};
    static const unsigned single[] = {1};
    size_t r = dszi_huf_readTable(&d, t, table(t, 3, 5, complete, 4), 16);
    CHECK(!dsz_isError(r));
    dszi_huf_freeDec(&d);
    CHECK(dsz_isError(dszi_huf_readTable(&d, t, table(t, 3, 5, over, 4), 16)));
    CHECK(dsz_isError(dszi_huf_readTable(&d, t, table(t, 3, 5, incomplete, 3), 16)));
    CHECK(dsz_isError(dszi_huf_readTable(&d, t, table(t, 4, 5, complete, 4), 16))); /* maxLen lies */
    CHECK(dsz_isError(dszi_huf_readTable(&d, t, table(t, 3, 14, complete, 4), 16))); /* past alphabet */
    r = dszi_huf_readTable(&d, t, table(t, 1, 3, single, 1), 16);
    CHECK(!dsz_isError(r) && d.single);
    dszi_huf_freeDec(&d);
}

/* dsz_decodeSparseCSR on a frame's raw sections against the dense decoder's result rd and matrix y
 * (the frame's dtype widened to float32): both fail, or both succeed with the CSR's entries,
 * scattered into a zero matrix, giving y bit for bit, row pointers from 0 to nnz never decreasing
 * and columns increasing in each row. From the encoder (exact), the arrays are also those
 * dsz_csrFromDense() makes of y, and one value less of capacity is DSZ_error_dstSize_tooSmall. */
static void csr_case(const dsz_frameInfo* f, const uint8_t* sections, size_t rd, const float* y, int exact)
{
    size_t const rows = (size_t)f->shape[0], cols = (size_t)f->shape[1], nnz = (size_t)f->nnz, n = rows * cols;
    int64_t* rp = (int64_t*)malloc(sizeof(int64_t) * (rows + 1));
    int32_t* ci = (int32_t*)malloc(sizeof(int32_t) * (nnz + 1));
    float* va = (float*)malloc(sizeof(float) * (nnz + 1));
    const uint8_t* const index = sections + f->dataRawSize;
    size_t const rc = dsz_decodeSparseCSR(rp, ci, va, nnz, f, sections, (size_t)f->dataRawSize, index,
                                          (size_t)f->indexRawSize);
    size_t o, p;
    CHECK(dsz_isError(rc) == dsz_isError(rd));
    if (!dsz_isError(rc) && !dsz_isError(rd)) {
        float* back = (float*)calloc(n + 1, sizeof(float));
        int ordered = rc == nnz && rp[0] == 0 && rp[rows] == (int64_t)nnz;
        for (o = 0; o < rows && ordered; o++)
            for (p = (size_t)rp[o]; p < (size_t)rp[o + 1] && ordered; p++) {
                ordered = ci[p] >= 0 && (size_t)ci[p] < cols && (p == (size_t)rp[o] || ci[p] > ci[p - 1]);
                if (ordered) back[o * cols + (size_t)ci[p]] = va[p];
            }
        CHECK(ordered && !memcmp(back, y, sizeof(float) * n));
        free(back);
    }
    if (exact) {
        int64_t* rp2 = (int64_t*)malloc(sizeof(int64_t) * (rows + 1));
        int32_t* ci2 = (int32_t*)malloc(sizeof(int32_t) * (nnz + 1));
        float* va2 = (float*)malloc(sizeof(float) * (nnz + 1));
        CHECK(rc == nnz && dsz_csrFromDense(rp2, ci2, va2, nnz, y, rows, cols) == nnz);
        CHECK(!memcmp(rp, rp2, sizeof(int64_t) * (rows + 1)) && !memcmp(ci, ci2, sizeof(int32_t) * nnz));
        CHECK(!memcmp(va, va2, sizeof(float) * nnz));
        if (nnz)
            CHECK(dsz_getErrorCode(dsz_decodeSparseCSR(rp, ci, va, nnz - 1, f, sections, (size_t)f->dataRawSize,
                                                       index, (size_t)f->indexRawSize)) == DSZ_error_dstSize_tooSmall);
        free(rp2); free(ci2); free(va2);
    }
    free(rp); free(ci); free(va);
}

static void sparse_case(size_t rows, size_t cols, double density, unsigned codec, int abuse)
{
    size_t const n = rows * cols;
    float* w = (float*)calloc(n + 1, sizeof(float));
    float* y = (float*)calloc(n + 1, sizeof(float));
    size_t const cap = dsz_sparseBound(rows, cols, n, 0);
    uint8_t* buf = (uint8_t*)malloc(cap);
    const dsz_params* const p = params(1e-2, DSZ_PRED_AUTO);
    dsz_frameInfo f;
    size_t i, cs, hs, r, nnz = 0, k;
    for (i = 0; i < n; i++)
        if (unif() < density) { w[i] = laplace(0.05); if (w[i] == 0.0f) w[i] = 1.0f; nnz++; }
    cs = dsz_encodeSparse(buf, cap, w, rows, cols, p, codec);
    CHECK(!dsz_isError(cs));
    hs = dsz_getFrameInfo(&f, buf, cs);
    CHECK(!dsz_isError(hs) && f.nnz == nnz && f.indexCodec == codec);
    CHECK(dsz_getFrameElementCount(buf, cs) == n); /* the dense size, not the non-zeros */
    r = dsz_decodeSparse(y, n, &f, buf + hs, (size_t)f.dataRawSize, buf + hs + f.dataRawSize, (size_t)f.indexRawSize);
    CHECK(r == nnz);
    for (i = 0; i < n; i++) CHECK((w[i] != 0) == (y[i] != 0) && fabs((double)w[i] - y[i]) <= 1e-2);
    csr_case(&f, buf + hs, r, y, 1);
    if (abuse) {
        /* every bit flipped in turn: both decoders fail together or agree (a CSR one value short of
           the header's nnz, or rows + 1 pointers for the header's rows, are what it may write) */
        for (k = 0; k < 8 * cs; k++) {
            buf[k / 8] ^= (uint8_t)(1u << (k % 8));
            hs = dsz_getFrameInfo(&f, buf, cs);
            if (!dsz_isError(hs) && f.nElements <= n && f.shape[0] <= n + 1
                && hs + f.dataRawSize + f.indexRawSize == cs) {
                memset(y, 0, sizeof(float) * n);
                r = dsz_decodeSparse(y, n, &f, buf + hs, (size_t)f.dataRawSize, buf + hs + f.dataRawSize,
                                     (size_t)f.indexRawSize);
                if (f.dtype == DSZ_DTYPE_FLOAT32) csr_case(&f, buf + hs, r, y, 0);
            }
            buf[k / 8] ^= (uint8_t)(1u << (k % 8));
        }
    }
    free(w);
    free(y);
    free(buf);
}

static void test_array_delta(void)
{
    float base[300], delta[300], out[300];
    unsigned long long shape[1] = {300};
    uint8_t buf[4096];
    const dsz_params* const p = params(1e-3, DSZ_PRED_AUTO);
    dsz_frameInfo f;
    size_t i, cs, hs;
    for (i = 0; i < 300; i++) {
        base[i] = laplace(0.1);
        delta[i] = (i % 7) ? laplace(0.01) : 0.0f;
    }
    cs = dsz_compress(buf, sizeof(buf), delta, shape, 1, p);
    CHECK(!dsz_isError(cs));
    hs = dsz_getFrameInfo(&f, buf, cs);
    CHECK(dsz_decodeArrayDelta(out, 300, base, &f, buf + hs, cs - hs) == 300);
    for (i = 0; i < 300; i++) CHECK(fabs((double)out[i] - ((double)base[i] + delta[i])) <= 1e-3 + 1e-6);
    /* in place, the same values */
    memcpy(delta, base, sizeof(base));
    CHECK(dsz_decodeArrayDelta(delta, 300, delta, &f, buf + hs, cs - hs) == 300);
    CHECK(!memcmp(delta, out, sizeof(out)));
    CHECK(dsz_getErrorCode(dsz_decodeArrayDelta(out, 299, base, &f, buf + hs, cs - hs)) == DSZ_error_dstSize_tooSmall);
    CHECK(dsz_getErrorCode(dsz_decodeArrayDelta(out, 300, base, &f, buf + hs, cs - hs - 1)) == DSZ_error_srcSize_wrong);
    CHECK(dsz_getErrorCode(dsz_decodeArrayDelta(out, 300, NULL, &f, buf + hs, cs - hs)) == DSZ_error_parameter_unsupported);
}

static void test_sparse(void)
{
    unsigned c;
    for (c = DSZ_INDEX_GAP8; c <= DSZ_INDEX_BITMAP; c++) {
        sparse_case(0, 0, 0.1, c, 0);
        sparse_case(1, 1000, 0.05, c, 0);
        sparse_case(1000, 1, 0.05, c, 0);
        sparse_case(100, 300, 0.09, c, 0);
        sparse_case(30, 40, 1.0, c, 0);
        sparse_case(30, 40, 0.0, c, 0);
        sparse_case(3, 2000, 0.002, c, 0);
        sparse_case(8, 9, 0.3, c, 1);
    }
}

/* Decoders read frames at any byte address and write floats at any 4-byte-aligned one: a .dsz
 * stream sits at an arbitrary offset of its file, and TFLite weight buffers are only 4-byte
 * aligned. Frames at 1 mod 8, output at 4 mod 8; the results must match the aligned decode bit
 * for bit (UBSan's alignment check and strict-alignment ARM under qemu watch the accesses). */
static void test_unaligned(void)
{
    size_t const rows = 64, cols = 96, n = rows * cols;
    float* w = (float*)calloc(n, sizeof(float));
    float* ref = (float*)calloc(n, sizeof(float));
    double* out_mem = (double*)calloc(n / 2 + 1, sizeof(double));
    float* const out = (float*)((char*)out_mem + 4);
    size_t const sb = dsz_sparseBound(rows, cols, n, 0), ab = dsz_compressBound(n, 0);
    size_t const cap = sb > ab ? sb : ab;
    uint8_t* buf = (uint8_t*)malloc(cap);
    uint8_t* odd_mem = (uint8_t*)malloc(cap + 8);
    uint8_t* const odd = odd_mem + 1;
    unsigned long long shape[1];
    const dsz_params* const p = params(1e-2, DSZ_PRED_AUTO);
    dsz_frameInfo f;
    size_t i, cs, hs;
    unsigned c;
    CHECK(((uintptr_t)out & 7u) == 4 && ((uintptr_t)odd & 3u) == 1);
    for (i = 0; i < n; i++) w[i] = unif() < 0.1 ? laplace(0.05) : 0.0f;

    shape[0] = n;
    cs = dsz_compress(buf, cap, w, shape, 1, p);
    CHECK(!dsz_isError(cs));
    memcpy(odd, buf, cs);
    CHECK(dsz_decompress(ref, n, buf, cs) == n);
    CHECK(dsz_decompress(out, n, odd, cs) == n);
    CHECK(memcmp(ref, out, sizeof(float) * n) == 0);

    for (c = DSZ_INDEX_GAP8; c <= DSZ_INDEX_BITMAP; c++) {
        cs = dsz_encodeSparse(buf, cap, w, rows, cols, p, c);
        CHECK(!dsz_isError(cs));
        memcpy(odd, buf, cs);
        hs = dsz_getFrameInfo(&f, odd, cs);
        CHECK(!dsz_isError(hs));
        if (dsz_isError(hs)) break;
        memset(ref, 0, sizeof(float) * n);
        memset(out, 0, sizeof(float) * n);
        CHECK(!dsz_isError(dsz_decodeSparse(ref, n, &f, buf + hs, (size_t)f.dataRawSize,
                                            buf + hs + f.dataRawSize, (size_t)f.indexRawSize)));
        CHECK(!dsz_isError(dsz_decodeSparse(out, n, &f, odd + hs, (size_t)f.dataRawSize,
                                            odd + hs + f.dataRawSize, (size_t)f.indexRawSize)));
        CHECK(memcmp(ref, out, sizeof(float) * n) == 0);
    }
    free(w);
    free(ref);
    free(out_mem);
    free(buf);
    free(odd_mem);
}

/* float16 round trips: every finite value within the bound of the original after the rounding
 * to float16, the rest (Inf, NaN payloads) bit for bit, written as float16 by both decoders */
static void half_case(const uint16_t* h, size_t n, double eb, unsigned pred)
{
    size_t const cap = dsz_sparseBound(1, n, n, 0);
    uint8_t* buf = (uint8_t*)malloc(cap);
    uint16_t* out = (uint16_t*)calloc(n ? n : 1, 2);
    unsigned long long shape[1];
    const dsz_params* const p = params(eb, pred);
    dsz_frameInfo f;
    size_t cs, hs, i, r;
    shape[0] = n;
    for (r = 0; r < 2; r++) {
        cs = r ? dsz_encodeSparseTyped(buf, cap, h, DSZ_DTYPE_FLOAT16, 1, n, p, DSZ_INDEX_HUFFGAP)
               : dsz_compressTyped(buf, cap, h, DSZ_DTYPE_FLOAT16, shape, 1, p);
        CHECK(!dsz_isError(cs));
        hs = dsz_getFrameInfo(&f, buf, cs);
        CHECK(!dsz_isError(hs) && f.dtype == DSZ_DTYPE_FLOAT16 && f.version == 2);
        memset(out, 0, 2 * n);
        if (r) CHECK(!dsz_isError(dsz_decodeSparseTyped(out, n, &f, buf + hs, f.dataRawSize, buf + hs + f.dataRawSize,
                                                         f.indexRawSize)));
        else CHECK(dsz_decompressArrayTyped(out, n, &f, buf + hs, cs - hs) == n);
        /* the float32 entry points refuse a float16 frame */
        CHECK(dsz_getErrorCode(dsz_decompressArray((float*)out, n, &f, buf + hs, cs - hs)) ==
              DSZ_error_frameParameter_unsupported || r);
        for (i = 0; i < n; i++) {
            float const x = dszi_f16_to_f32(h[i]), y = dszi_f16_to_f32(out[i]);
            if (isfinite(x)) CHECK(fabs((double)x - (double)y) <= eb && (!r || (x == 0.0f) == (y == 0.0f)));
            else CHECK(h[i] == out[i]);
        }
    }
    free(buf);
    free(out);
}

static void test_half(void)
{
    static const uint16_t special[] = {0x0000, 0x8000, 0x0001, 0x8001, 0x03ff, 0x0400, 0x7bff, 0xfbff, 0x7c00,
                                       0xfc00, 0x7e01, 0xfd55, 0x3c00, 0xbc00, 0x3555, 0x7bfe};
    static const double ebs[] = {1e-12, 3e-8, 6e-5, 1e-3, 0.5, 16.0, 1e4, 6e4, 1e6, 1e300};
    size_t const n = 5000;
    uint16_t* h = (uint16_t*)malloc(2 * n);
    size_t i;
    float f;
    /* the conversions: exact both ways for every float16 pattern (NaN payloads included) */
    for (i = 0; i < 65536; i++) CHECK(dszi_f32_to_f16(dszi_f16_to_f32((uint32_t)i)) == i);
    CHECK(dszi_f16_round(65519.0) == 65504.0f && dszi_f16_round(65520.0) == 0.0f);
    CHECK(dszi_f16_round(1.0 + 1.0 / 2048) == 1.0f && dszi_f16_round(1.0 + 3.0 / 2048) == 1.0f + 2.0f / 1024);
    CHECK(dszi_f16_round(2.9802322387695312e-08) == 0.0f && dszi_f16_round(3e-8) == 5.9604644775390625e-08f);
    for (i = 0; i < n; i++) {
        f = laplace(0.05);
        h[i] = (uint16_t)dszi_f32_to_f16(dszi_f16_round(f));
    }
    half_case(h, n, 1e-3, DSZ_PRED_NONE);
    half_case(h, n, 1e-3, DSZ_PRED_LORENZO);
    half_case(h, 0, 1e-3, DSZ_PRED_AUTO);
    for (i = 0; i < sizeof(ebs) / sizeof(ebs[0]); i++) {
        half_case(special, 16, ebs[i], DSZ_PRED_NONE);
        half_case(special, 16, ebs[i], DSZ_PRED_LORENZO);
    }
    free(h);
}

/* int8 / uint8: the bound is k + 1/2 (k steps); lossless at k = 0; other bounds are refused */
static void test_int8(void)
{
    size_t const n = 3000;
    int8_t* x = (int8_t*)malloc(n);
    uint8_t* u = (uint8_t*)malloc(n);
    int8_t* out = (int8_t*)malloc(n);
    uint8_t* uout = (uint8_t*)malloc(n);
    size_t const cap = dsz_compressBound(n, 0);
    uint8_t* buf = (uint8_t*)malloc(cap);
    unsigned long long shape[1];
    dsz_frameInfo f;
    size_t i, cs, hs;
    unsigned k, pred;
    const dsz_params* p = params(1.0, DSZ_PRED_NONE);
    shape[0] = n;
    for (i = 0; i < n; i++) {
        double const v = laplace(20.0);
        x[i] = (int8_t)(v > 127 ? 127 : v < -128 ? -128 : v);
        u[i] = (uint8_t)(x[i] + 128);
    }
    x[0] = -128; x[1] = 127; u[0] = 0; u[1] = 255;
    CHECK(dsz_getErrorCode(dsz_compressTyped(buf, cap, x, DSZ_DTYPE_INT8, shape, 1, p)) == DSZ_error_parameter_outOfBound);
    for (k = 0; k < 4; k++) {
        for (pred = DSZ_PRED_NONE; pred <= DSZ_PRED_LORENZO; pred++) {
            p = params(k + 0.5, pred);
            cs = dsz_compressTyped(buf, cap, x, DSZ_DTYPE_INT8, shape, 1, p);
            hs = dsz_getFrameInfo(&f, buf, cs);
            CHECK(!dsz_isError(hs) && f.dtype == DSZ_DTYPE_INT8);
            CHECK(dsz_decompressArrayTyped(out, n, &f, buf + hs, cs - hs) == n);
            for (i = 0; i < n; i++) CHECK(abs(out[i] - x[i]) <= (int)k);
            cs = dsz_compressTyped(buf, cap, u, DSZ_DTYPE_UINT8, shape, 1, p);
            hs = dsz_getFrameInfo(&f, buf, cs);
            CHECK(dsz_decompressArrayTyped(uout, n, &f, buf + hs, cs - hs) == n);
            for (i = 0; i < n; i++) CHECK(abs(uout[i] - u[i]) <= (int)k);
        }
    }
    free(x); free(u); free(out); free(uout); free(buf);
}

/* The fused sparse decoder's fast path (Huffman gaps and values, predictor none) on a stream long
 * enough to reach it, in each 1- and 2-byte dtype: bounded values and exact positions, then every
 * seventh byte flipped: an error or a full decode, never an access out of bounds (ASan watches). */
static void test_sparse_fast_path(void)
{
    size_t const rows = 200, cols = 400, n = rows * cols;
    int8_t* x = (int8_t*)malloc(n);
    uint16_t* h = (uint16_t*)malloc(2 * n);
    uint8_t* out = (uint8_t*)malloc(2 * n);
    float* wide = (float*)malloc(sizeof(float) * n);
    size_t const cap = dsz_sparseBound(rows, cols, n, 0);
    uint8_t* buf = (uint8_t*)malloc(cap);
    dsz_frameInfo f;
    size_t i, cs, hs, at;
    unsigned t;
    for (i = 0; i < n; i++) {
        double const v = unif() < 0.1 ? laplace(30.0) : 0.0;
        x[i] = (int8_t)(v > 127 ? 127 : v < -128 ? -128 : v);
        h[i] = (uint16_t)dszi_f32_to_f16((float)x[i] / 64.0f);
    }
    for (i = 1000; i < 3000; i++) x[i] = 0, h[i] = 0; /* gaps past 255: fillers */
    for (t = 0; t < 2; t++) {
        unsigned const dtype = t ? DSZ_DTYPE_FLOAT16 : DSZ_DTYPE_INT8;
        const dsz_params* const p = params_radius(t ? 1e-3 : 1.5, DSZ_PRED_NONE, 16); /* the largest values are outliers */
        const void* const src = t ? (const void*)h : (const void*)x;
        cs = dsz_encodeSparseTyped(buf, cap, src, dtype, rows, cols, p, DSZ_INDEX_HUFFGAP);
        hs = dsz_getFrameInfo(&f, buf, cs);
        CHECK(!dsz_isError(cs) && !dsz_isError(hs));
        memset(out, 0, 2 * n);
        CHECK(dsz_decodeSparseTyped(out, n, &f, buf + hs, f.dataRawSize, buf + hs + f.dataRawSize, f.indexRawSize) == f.nnz);
        for (i = 0; i < n; i++) {
            if (t) {
                float const a = dszi_f16_to_f32(h[i]), b = dszi_f16_to_f32(dszi_rd16(out + 2 * i));
                CHECK((a == 0) == (b == 0) && fabs((double)a - (double)b) <= 1e-3);
            } else {
                CHECK((x[i] == 0) == ((int8_t)out[i] == 0) && abs((int8_t)out[i] - x[i]) <= 1);
            }
        }
        for (at = hs; at < cs; at += 7) {
            size_t r;
            buf[at] ^= (uint8_t)(1u << (at & 7));
            memset(out, 0, 2 * n);
            r = dsz_decodeSparseTyped(out, n, &f, buf + hs, f.dataRawSize, buf + hs + f.dataRawSize, f.indexRawSize);
            dszi_dtype_load(wide, out, dtype, n);
            csr_case(&f, buf + hs, r, wide, 0);
            buf[at] ^= (uint8_t)(1u << (at & 7));
        }
    }
    free(x); free(h); free(out); free(wide); free(buf);
}

/* The CSR decoder in every dtype, index codec and predictor equals dsz_csrFromDense of the dense
 * decode widened to float32 (empty rows, gaps past 255 and outliers included); more than 2^31
 * columns is an error, as dsz_csrFromDense makes it. */
static void test_sparse_csr(void)
{
    size_t const rows = 60, cols = 700, n = rows * cols;
    float* w = (float*)calloc(n, sizeof(float));
    uint8_t* raw = (uint8_t*)malloc(4 * n);
    uint8_t* out = (uint8_t*)malloc(4 * n);
    float* wide = (float*)malloc(sizeof(float) * n);
    size_t const cap = dsz_sparseBound(rows, cols, n, 0);
    uint8_t* buf = (uint8_t*)malloc(cap);
    dsz_frameInfo f;
    size_t i, cs, hs, r;
    unsigned dtype, codec, pred;
    for (i = 0; i < n; i++)
        if (i / cols % 7 != 3 && (i < 5000 || i > 9000) && unif() < 0.08) w[i] = laplace(20.0);
    for (dtype = DSZ_DTYPE_FLOAT32; dtype <= DSZ_DTYPE_UINT8; dtype++)
        for (codec = DSZ_INDEX_GAP8; codec <= DSZ_INDEX_BITMAP; codec++)
            for (pred = DSZ_PRED_NONE; pred <= DSZ_PRED_LORENZO; pred++) {
                double const eb = dtype == DSZ_DTYPE_FLOAT32 ? 1e-2 : dtype == DSZ_DTYPE_FLOAT16 ? 1e-1 : 2.5;
                const dsz_params* const p = params_radius(eb, pred, 64); /* some outliers */
                for (i = 0; i < n; i++) {
                    float v = w[i];
                    uint32_t bits;
                    /* integers away from zero, so that a non-zero stays one */
                    if (dtype == DSZ_DTYPE_INT8) v = v > 127 ? 127 : v < -128 ? -128 : v > 0 ? ceilf(v) : floorf(v);
                    if (dtype == DSZ_DTYPE_UINT8) v = fabsf(v) > 255 ? 255 : ceilf(fabsf(v));
                    memcpy(&bits, &v, 4);
                    dszi_outlier_write(raw + dszi_dtype_size(dtype) * i, bits, dtype);
                }
                cs = dsz_encodeSparseTyped(buf, cap, raw, dtype, rows, cols, p, codec);
                hs = dsz_getFrameInfo(&f, buf, cs);
                CHECK(!dsz_isError(cs) && !dsz_isError(hs) && f.predictor == pred && f.nnz > 1000);
                memset(out, 0, 4 * n);
                r = dsz_decodeSparseTyped(out, n, &f, buf + hs, f.dataRawSize, buf + hs + f.dataRawSize,
                                          f.indexRawSize);
                CHECK(r == f.nnz);
                dszi_dtype_load(wide, out, dtype, n);
                csr_case(&f, buf + hs, r, wide, 1);
            }
    { /* an empty matrix of 2^31 + 1 columns */
        const dsz_params* const p = params(1e-2, DSZ_PRED_NONE);
        int64_t rp[1];
        cs = dsz_encodeSparse(buf, cap, NULL, 0, (size_t)INT32_MAX + 2, p, DSZ_INDEX_GAP8);
        hs = dsz_getFrameInfo(&f, buf, cs);
        CHECK(!dsz_isError(cs) && !dsz_isError(hs));
        CHECK(dsz_getErrorCode(dsz_decodeSparseCSR(rp, NULL, NULL, 0, &f, buf + hs, f.dataRawSize,
                                                   buf + hs + f.dataRawSize, f.indexRawSize))
              == DSZ_error_parameter_outOfBound);
        f.shape[1] = (size_t)INT32_MAX + 1;
        CHECK(dsz_decodeSparseCSR(rp, NULL, NULL, 0, &f, buf + hs, f.dataRawSize, buf + hs + f.dataRawSize,
                                  f.indexRawSize) == 0 && rp[0] == 0);
    }
    free(w); free(raw); free(out); free(wide); free(buf);
}

/* dense reference in the kernel's order: the row's non-zeros by column, then the bias */
static void test_csr_matmul(void)
{
    size_t const rows = 37, cols = 4500, n = 131; /* more than one column slice and sample block */
    float* w = (float*)calloc(rows * cols, sizeof(float));
    float* x = (float*)malloc(sizeof(float) * n * cols);
    float* y = (float*)malloc(sizeof(float) * n * rows);
    float* bias = (float*)malloc(sizeof(float) * rows);
    int64_t* rowPtr = (int64_t*)malloc(sizeof(int64_t) * (rows + 1));
    int32_t* colIndex = (int32_t*)malloc(sizeof(int32_t) * rows * cols);
    float* values = (float*)malloc(sizeof(float) * rows * cols);
    size_t i, o, k, nnz = 0, exact = 0, split;
    int32_t saved;
    for (o = 0; o < rows; o++) {
        rowPtr[o] = (int64_t)nnz;
        bias[o] = laplace(0.1);
        for (k = 0; k < cols; k++)
            if (o != 5 && unif() < 0.08) { /* row 5 stays empty */
                w[o * cols + k] = laplace(0.05);
                colIndex[nnz] = (int32_t)k;
                values[nnz++] = w[o * cols + k];
            }
    }
    rowPtr[rows] = (int64_t)nnz;
    for (i = 0; i < n * cols; i++) x[i] = laplace(1.0);
    { /* dsz_csrFromDense gives the same arrays, and refuses a short capacity */
        int64_t* rp = (int64_t*)malloc(sizeof(int64_t) * (rows + 1));
        int32_t* ci = (int32_t*)malloc(sizeof(int32_t) * nnz);
        float* va = (float*)malloc(sizeof(float) * nnz);
        CHECK(dsz_csrFromDense(rp, ci, va, nnz, w, rows, cols) == nnz);
        CHECK(!memcmp(rp, rowPtr, sizeof(int64_t) * (rows + 1)) && !memcmp(ci, colIndex, sizeof(int32_t) * nnz));
        CHECK(!memcmp(va, values, sizeof(float) * nnz));
        CHECK(dsz_getErrorCode(dsz_csrFromDense(rp, ci, va, nnz - 1, w, rows, cols)) == DSZ_error_dstSize_tooSmall);
        free(rp); free(ci); free(va);
    }
    CHECK(dsz_csrMatmul(y, n * rows, x, n, cols, rowPtr, colIndex, values, nnz, rows, bias) == n * rows);
    for (i = 0; i < n; i++)
        for (o = 0; o < rows; o++) {
            float acc = 0.0f, prod;
            for (k = 0; k < cols; k++)
                if (w[o * cols + k] != 0.0f) { prod = w[o * cols + k] * x[i * cols + k]; acc += prod; }
            acc += bias[o];
            exact += same_bits(acc, y[i * rows + o]);
        }
    CHECK(exact == n * rows);
    /* any split of the samples gives the same bits */
    {
        float* y2 = (float*)malloc(sizeof(float) * n * rows);
        split = 70;
        CHECK(dsz_csrMatmul(y2, split * rows, x, split, cols, rowPtr, colIndex, values, nnz, rows, bias) == split * rows);
        CHECK(dsz_csrMatmul(y2 + split * rows, (n - split) * rows, x + split * cols, n - split, cols, rowPtr, colIndex,
                            values, nnz, rows, bias) == (n - split) * rows);
        CHECK(!memcmp(y, y2, sizeof(float) * n * rows));
        CHECK(dsz_csrMatmul(y2, n * rows, x, n, cols, rowPtr, colIndex, values, nnz, rows, NULL) == n * rows);
        CHECK(y2[5] == 0.0f && y[5] == bias[5]);
        free(y2);
    }
    /* no samples, and bad input: a short output, an index out of range or out of order, bad pointers */
    CHECK(dsz_csrMatmul(y, 0, x, 0, cols, rowPtr, colIndex, values, nnz, rows, bias) == 0);
    CHECK(dsz_getErrorCode(dsz_csrMatmul(y, n * rows - 1, x, n, cols, rowPtr, colIndex, values, nnz, rows, bias)) == DSZ_error_dstSize_tooSmall);
    saved = colIndex[3];
    colIndex[3] = (int32_t)cols;
    CHECK(dsz_getErrorCode(dsz_csrMatmul(y, n * rows, x, n, cols, rowPtr, colIndex, values, nnz, rows, bias)) == DSZ_error_corruption_detected);
    colIndex[3] = -1;
    CHECK(dsz_getErrorCode(dsz_csrMatmul(y, n * rows, x, n, cols, rowPtr, colIndex, values, nnz, rows, bias)) == DSZ_error_corruption_detected);
    colIndex[3] = colIndex[2];
    CHECK(dsz_getErrorCode(dsz_csrMatmul(y, n * rows, x, n, cols, rowPtr, colIndex, values, nnz, rows, bias)) == DSZ_error_corruption_detected);
    colIndex[3] = saved;
    CHECK(dsz_getErrorCode(dsz_csrMatmul(y, n * rows, x, n, cols, rowPtr, colIndex, values, nnz - 1, rows, bias)) == DSZ_error_corruption_detected);
    rowPtr[2] = rowPtr[1] - 1;
    CHECK(dsz_getErrorCode(dsz_csrMatmul(y, n * rows, x, n, cols, rowPtr, colIndex, values, nnz, rows, bias)) == DSZ_error_corruption_detected);
    free(w); free(x); free(y); free(bias); free(rowPtr); free(colIndex); free(values);
}

int main(void)
{
    test_errors();
    test_arrays();
    test_bad_params();
    test_params();
    test_header();
    test_huffman_tables();
    test_array_delta();
    test_sparse();
    test_unaligned();
    test_half();
    test_int8();
    test_sparse_fast_path();
    test_sparse_csr();
    test_csr_matmul();
    dsz_freeParams(shared_params);
    if (failures) {
        fprintf(stderr, "%d check(s) failed\n", failures);
        return 1;
    }
    printf("libdsz tests passed\n");
    return 0;
}
