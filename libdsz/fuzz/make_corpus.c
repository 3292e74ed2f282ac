/* Seed corpus generator: small valid array and sparse frames with raw sections, covering
 * both predictors, outliers (NaN, Inf, a tiny radius), several shapes and the three index
 * codecs; the frames again for the header target; their index sections in fuzz_index's
 * input layout; round-trip inputs in fuzz_roundtrip's layout; the float32 array frames again for
 * the delta target.
 * Usage: make_corpus <corpus-dir> (writes its array, sparse, header, index, roundtrip, delta folders) */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define DSZ_STATIC_LINKING_ONLY /* dsz_getFrameInfo, to cut the sections out of the frames */
#include "dsz.h"

static unsigned long long rng = 0x9E3779B97F4A7C15ull;
static double unif(void)
{
    rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17;
    return (double)(rng >> 11) / 9007199254740992.0;
}

static const char* root;

static int save(const char* dir, const char* name, const void* buf, size_t n)
{
    char path[1024];
    FILE* f;
    snprintf(path, sizeof(path), "%s/%s/%s", root, dir, name);
    f = fopen(path, "wb");
    if (!f || fwrite(buf, 1, n, f) != n) { fprintf(stderr, "cannot write %s\n", path); if (f) fclose(f); return 1; }
    fclose(f);
    return 0;
}

/* a parameter object (mode abs, user bound eb), or NULL where one is refused */
static dsz_params* params(double eb, unsigned pred, unsigned radius)
{
    dsz_params* const p = dsz_createParams();
    if (p && (dsz_params_setParameter(p, dsz_p_errorBound, eb) || dsz_params_setParameter(p, dsz_p_predictor, pred)
              || dsz_params_setParameter(p, dsz_p_radius, radius))) {
        dsz_freeParams(p);
        return NULL;
    }
    return p;
}

static int array_seed(const char* name, const unsigned long long* shape, unsigned ndim,
                      double eb, unsigned pred, unsigned radius, int specials)
{
    size_t n = 1, i, cap, r;
    unsigned d;
    float* x;
    void* buf;
    int bad;
    dsz_params* const p = params(eb, pred, radius);
    for (d = 0; d < ndim; d++) n *= (size_t)shape[d];
    x = (float*)malloc((n + 1) * sizeof(float));
    cap = dsz_compressBound(n, radius);
    buf = malloc(cap);
    if (!x || !buf) return 1;
    for (i = 0; i < n; i++) x[i] = (float)(sin((double)i * 0.3) + 0.2 * (unif() - 0.5));
    if (specials && n >= 4) { x[0] = NAN; x[1] = INFINITY; x[2] = -INFINITY; x[3] = 1e30f; }
    r = dsz_compress(buf, cap, x, shape, ndim, p);
    bad = dsz_isError(r) ? (fprintf(stderr, "%s: %s\n", name, dsz_getErrorName(r)), 1)
                         : save("array", name, buf, r) | save("header", name, buf, r) | save("delta", name, buf, r);
    free(x);
    free(buf);
    dsz_freeParams(p);
    return bad;
}

/* fuzz_index's input: codec, rows - 1, cols - 1 (LE16), nnz (LE16), the index section */
static int index_seed(const char* name, const unsigned char* frame, size_t size)
{
    dsz_frameInfo f;
    unsigned char* in;
    size_t const hs = dsz_getFrameInfo(&f, frame, size);
    int bad;
    if (dsz_isError(hs)) return 1;
    in = (unsigned char*)malloc(6 + (size_t)f.indexRawSize);
    if (!in) return 1;
    in[0] = (unsigned char)f.indexCodec;
    in[1] = (unsigned char)(f.shape[0] - 1);
    in[2] = (unsigned char)(f.shape[1] - 1);
    in[3] = (unsigned char)((f.shape[1] - 1) >> 8);
    in[4] = (unsigned char)f.nnz;
    in[5] = (unsigned char)(f.nnz >> 8);
    memcpy(in + 6, frame + hs + f.dataRawSize, (size_t)f.indexRawSize);
    bad = save("index", name, in, 6 + (size_t)f.indexRawSize);
    free(in);
    return bad;
}

/* fuzz_roundtrip's input: flags, radius - 1, bound exponent and mantissa, shape, n values */
static int roundtrip_seed(const char* name, unsigned char flags, unsigned char radius1, unsigned char e,
                          unsigned char shape, size_t n, double density, int specials)
{
    unsigned char* in = (unsigned char*)malloc(5 + 4 * n);
    size_t i;
    int bad;
    if (!in) return 1;
    in[0] = flags; in[1] = radius1; in[2] = e; in[3] = 0; in[4] = shape;
    for (i = 0; i < n; i++) {
        float const v = unif() < density ? (float)(sin((double)i * 0.2) + 0.1 * (unif() - 0.5)) : 0.0f;
        memcpy(in + 5 + 4 * i, &v, 4);
    }
    if (specials && n >= 4) {
        static const float sp[4] = {NAN, INFINITY, -INFINITY, 3e38f};
        memcpy(in + 5, sp, sizeof(sp));
    }
    bad = save("roundtrip", name, in, 5 + 4 * n);
    free(in);
    return bad;
}

static int sparse_seed(const char* name, size_t rows, size_t cols, double density, double eb,
                       unsigned pred, unsigned codec)
{
    size_t const n = rows * cols;
    size_t i, cap, r;
    float* w = (float*)calloc(n + 1, sizeof(float));
    void* buf;
    int bad;
    dsz_params* const p = params(eb, pred, 0);
    cap = dsz_sparseBound(rows, cols, n, 0);
    buf = malloc(cap);
    if (!w || !buf) return 1;
    for (i = 0; i < n; i++)
        if (unif() < density) w[i] = (float)(unif() - 0.5);
    if (n > 600) w[n - 1] = 0.25f; /* a long gap: filler symbols */
    r = dsz_encodeSparse(buf, cap, w, rows, cols, p, codec);
    if (dsz_isError(r)) {
        fprintf(stderr, "%s: %s\n", name, dsz_getErrorName(r));
        bad = 1;
    } else {
        bad = save("sparse", name, buf, r) | save("header", name, buf, r);
        bad |= index_seed(name, buf, r);
    }
    free(w);
    free(buf);
    dsz_freeParams(p);
    return bad;
}

/* n values of a dtype (float16 bit patterns, int8, uint8) like the float seeds: a sine with
 * noise, zeros where unif() >= density; float16 gets the special values too */
static unsigned char* typed_values(unsigned dtype, size_t n, double density, double scale)
{
    size_t const width = dtype == DSZ_DTYPE_FLOAT16 ? 2 : 1;
    unsigned char* v = (unsigned char*)calloc(n ? n * width : 1, 1);
    size_t i;
    static const unsigned char sp16[8] = {0x00, 0x7e, 0x00, 0x7c, 0x00, 0xfc, 0x01, 0x00}; /* NaN, +-Inf, subnormal */
    if (!v) return NULL;
    for (i = 0; i < n; i++) {
        double const x = unif() < density ? sin((double)i * 0.3) + 0.2 * (unif() - 0.5) : 0.0;
        if (dtype == DSZ_DTYPE_FLOAT16) {
            /* the float16 nearest to x within 2^-11 relative: enough for a seed */
            int e;
            double const m = frexp(x, &e);
            unsigned const sign = x < 0, mant = (unsigned)(fabs(m) * 2048.0) & 0x3ff;
            unsigned const bits = x == 0.0 || e < -13 ? 0 : (sign << 15) | ((unsigned)(e + 14) << 10) | mant;
            v[2 * i] = (unsigned char)bits;
            v[2 * i + 1] = (unsigned char)(bits >> 8);
        } else {
            double const q = x * scale + (dtype == DSZ_DTYPE_UINT8 ? 128.0 : 0.0);
            v[i] = (unsigned char)(signed char)(q < -128 ? -128 : q > 255 ? 255 : (int)q);
        }
    }
    if (dtype == DSZ_DTYPE_FLOAT16 && n >= 4) memcpy(v, sp16, sizeof(sp16));
    return v;
}

/* array and sparse frames of a dtype: into the array or sparse, header and index corpora */
static int typed_seed(const char* name, unsigned dtype, size_t rows, size_t cols, double density, double eb,
                      unsigned pred, int sparse, unsigned codec)
{
    size_t const n = rows * cols;
    unsigned long long const shape[2] = {rows, cols};
    unsigned char* v = typed_values(dtype, n, density, 60.0);
    size_t const cap = dsz_sparseBound(rows, cols, n, 0) + dsz_compressBound(n, 0);
    void* buf = malloc(cap);
    dsz_params* const p = params(eb, pred, 0);
    size_t r;
    int bad;
    if (!v || !buf) return 1;
    r = sparse ? dsz_encodeSparseTyped(buf, cap, v, dtype, rows, cols, p, codec)
               : dsz_compressTyped(buf, cap, v, dtype, shape, 2, p);
    if (dsz_isError(r)) {
        fprintf(stderr, "%s: %s\n", name, dsz_getErrorName(r));
        bad = 1;
    } else {
        bad = save(sparse ? "sparse" : "array", name, buf, r) | save("header", name, buf, r);
        if (sparse) bad |= index_seed(name, buf, r);
    }
    free(v);
    free(buf);
    dsz_freeParams(p);
    return bad;
}

/* fuzz_roundtrip's input for a dtype: flags bits 6-7 the dtype, the mantissa byte k (int bound) */
static int typed_roundtrip_seed(const char* name, unsigned dtype, unsigned char flags, unsigned char e,
                                unsigned char k, unsigned char shape, size_t n, double density)
{
    size_t const width = dtype == DSZ_DTYPE_FLOAT16 ? 2 : 1;
    unsigned char* v = typed_values(dtype, n, density, 60.0);
    unsigned char* in = (unsigned char*)malloc(5 + width * n);
    int bad;
    if (!v || !in) return 1;
    in[0] = (unsigned char)(flags | (dtype - DSZ_DTYPE_FLOAT32) << 6); in[1] = 255; in[2] = e; in[3] = k; in[4] = shape;
    memcpy(in + 5, v, width * n);
    bad = save("roundtrip", name, in, 5 + width * n);
    free(v);
    free(in);
    return bad;
}

int main(int argc, char** argv)
{
    static const unsigned long long s1[1] = {200}, s2[2] = {12, 17}, s3[3] = {4, 5, 6}, s0[1] = {0};
    static const unsigned long long s8[8] = {2, 2, 2, 2, 2, 2, 2, 2};
    static const char* const codecs[3] = {"gap8", "huffgap", "bitmap"};
    static const char* const preds[3] = {"none", "lorenzo", "auto"};
    char name[64];
    unsigned pred, c;
    int bad = 0;
    if (argc != 2) { fprintf(stderr, "usage: %s <corpus-dir>\n", argv[0]); return 2; }
    root = argv[1];
    for (pred = DSZ_PRED_NONE; pred <= DSZ_PRED_LORENZO; pred++) {
        const char* const pn = preds[pred];
        snprintf(name, sizeof(name), "%s_1d", pn); bad |= array_seed(name, s1, 1, 1e-3, pred, 0, 0);
        snprintf(name, sizeof(name), "%s_2d", pn); bad |= array_seed(name, s2, 2, 1e-2, pred, 0, 0);
        snprintf(name, sizeof(name), "%s_3d", pn); bad |= array_seed(name, s3, 3, 1e-2, pred, 0, 1);
        snprintf(name, sizeof(name), "%s_8d", pn); bad |= array_seed(name, s8, 8, 0.05, pred, 0, 0);
        snprintf(name, sizeof(name), "%s_radius2", pn); bad |= array_seed(name, s1, 1, 1e-3, pred, 2, 1);
        snprintf(name, sizeof(name), "%s_coarse", pn); bad |= array_seed(name, s2, 2, 10.0, pred, 0, 0);
        snprintf(name, sizeof(name), "%s_empty", pn); bad |= array_seed(name, s0, 1, 1e-3, pred, 0, 0);
        for (c = DSZ_INDEX_GAP8; c <= DSZ_INDEX_BITMAP; c++) {
            snprintf(name, sizeof(name), "%s_%s_30x40", pn, codecs[c]);
            bad |= sparse_seed(name, 30, 40, 0.1, 1e-2, pred, c);
            snprintf(name, sizeof(name), "%s_%s_4x700", pn, codecs[c]);
            bad |= sparse_seed(name, 4, 700, 0.01, 1e-2, pred, c);
        }
    }
    for (c = DSZ_INDEX_GAP8; c <= DSZ_INDEX_BITMAP; c++) {
        snprintf(name, sizeof(name), "dense_%s_9x9", codecs[c]);
        bad |= sparse_seed(name, 9, 9, 1.0, 1e-2, DSZ_PRED_LORENZO, c);
        snprintf(name, sizeof(name), "empty_%s_5x5", codecs[c]);
        bad |= sparse_seed(name, 5, 5, 0.0, 1e-2, DSZ_PRED_NONE, c);
    }
    bad |= array_seed("scalar", s1, 0, 1e-3, DSZ_PRED_LORENZO, 0, 0);
    /* round trips: flags bit 0 sparse, bits 1-2 predictor, bits 3-4 index codec; bound 2^(e-151) */
    for (pred = 0; pred < 3; pred++) {
        snprintf(name, sizeof(name), "array_%s", preds[pred]);
        bad |= roundtrip_seed(name, (unsigned char)(pred << 1), 255, 141, 1, 120, 1.0, 1);
        snprintf(name, sizeof(name), "array_%s_radius1", preds[pred]);
        bad |= roundtrip_seed(name, (unsigned char)(pred << 1), 0, 141, 2, 40, 1.0, 0);
        for (c = DSZ_INDEX_GAP8; c <= DSZ_INDEX_BITMAP; c++) {
            snprintf(name, sizeof(name), "sparse_%s_%s", preds[pred], codecs[c]);
            bad |= roundtrip_seed(name, (unsigned char)(1 | pred << 1 | c << 3), 255, 141, 15, 160, 0.2, 1);
        }
    }
    bad |= roundtrip_seed("array_tiny_bound", 0, 255, 1, 1, 16, 1.0, 0);
    bad |= roundtrip_seed("array_huge_bound", 2, 255, 254, 1, 16, 1.0, 1);
    /* float16, int8, uint8 frames (format version 2) */
    {
        static const unsigned dtypes[3] = {DSZ_DTYPE_FLOAT16, DSZ_DTYPE_INT8, DSZ_DTYPE_UINT8};
        static const char* const dn[3] = {"f16", "i8", "u8"};
        unsigned t;
        for (t = 0; t < 3; t++) {
            double const eb = dtypes[t] == DSZ_DTYPE_FLOAT16 ? 1e-2 : 1.5;
            for (pred = DSZ_PRED_NONE; pred <= DSZ_PRED_LORENZO; pred++) {
                snprintf(name, sizeof(name), "%s_%s_12x17", dn[t], preds[pred]);
                bad |= typed_seed(name, dtypes[t], 12, 17, 1.0, eb, pred, 0, 0);
                for (c = DSZ_INDEX_GAP8; c <= DSZ_INDEX_BITMAP; c++) {
                    snprintf(name, sizeof(name), "%s_%s_%s_30x40", dn[t], preds[pred], codecs[c]);
                    bad |= typed_seed(name, dtypes[t], 30, 40, 0.1, eb, pred, 1, c);
                }
            }
            snprintf(name, sizeof(name), "%s_lossless_20x10", dn[t]);
            if (dtypes[t] != DSZ_DTYPE_FLOAT16) bad |= typed_seed(name, dtypes[t], 20, 10, 1.0, 0.5, DSZ_PRED_NONE, 0, 0);
            snprintf(name, sizeof(name), "%s_array", dn[t]);
            bad |= typed_roundtrip_seed(name, dtypes[t], 2, 141, 1, 1, 120, 1.0);
            snprintf(name, sizeof(name), "%s_sparse", dn[t]);
            bad |= typed_roundtrip_seed(name, dtypes[t], 1 | 1 << 3, 141, 2, 15, 160, 0.2);
        }
    }
    return bad;
}
