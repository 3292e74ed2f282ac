/* Seed corpus generator: small valid array and sparse frames with raw sections, covering
 * both predictors, outliers (NaN, Inf, a tiny radius), several shapes and the three index
 * codecs. Usage: make_corpus <array-dir> <sparse-dir> */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dsz.h"

static unsigned long long rng = 0x9E3779B97F4A7C15ull;
static double unif(void)
{
    rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17;
    return (double)(rng >> 11) / 9007199254740992.0;
}

static int save(const char* dir, const char* name, const void* buf, size_t n)
{
    char path[1024];
    FILE* f;
    snprintf(path, sizeof(path), "%s/%s", dir, name);
    f = fopen(path, "wb");
    if (!f || fwrite(buf, 1, n, f) != n) { fprintf(stderr, "cannot write %s\n", path); if (f) fclose(f); return 1; }
    fclose(f);
    return 0;
}

static dsz_params params(double eb, unsigned pred, unsigned radius)
{
    dsz_params p;
    p.errorBound = eb; p.userBound = eb; p.mode = DSZ_MODE_ABS; p.predictor = pred; p.radius = radius;
    return p;
}

static int array_seed(const char* dir, const char* name, const unsigned long long* shape, unsigned ndim,
                      double eb, unsigned pred, unsigned radius, int specials)
{
    size_t n = 1, i, cap, r;
    unsigned d;
    float* x;
    void* buf;
    int bad;
    dsz_params const p = params(eb, pred, radius);
    for (d = 0; d < ndim; d++) n *= (size_t)shape[d];
    x = (float*)malloc((n + 1) * sizeof(float));
    cap = dsz_compressBound(n, radius);
    buf = malloc(cap);
    if (!x || !buf) return 1;
    for (i = 0; i < n; i++) x[i] = (float)(sin((double)i * 0.3) + 0.2 * (unif() - 0.5));
    if (specials && n >= 4) { x[0] = NAN; x[1] = INFINITY; x[2] = -INFINITY; x[3] = 1e30f; }
    r = dsz_compress(buf, cap, x, shape, ndim, &p);
    bad = dsz_isError(r) ? (fprintf(stderr, "%s: %s\n", name, dsz_getErrorName(r)), 1) : save(dir, name, buf, r);
    free(x);
    free(buf);
    return bad;
}

static int sparse_seed(const char* dir, const char* name, size_t rows, size_t cols, double density, double eb,
                       unsigned pred, unsigned codec)
{
    size_t const n = rows * cols;
    size_t i, cap, r;
    float* w = (float*)calloc(n + 1, sizeof(float));
    void* buf;
    int bad;
    dsz_params const p = params(eb, pred, 0);
    cap = dsz_sparseBound(rows, cols, n, 0);
    buf = malloc(cap);
    if (!w || !buf) return 1;
    for (i = 0; i < n; i++)
        if (unif() < density) w[i] = (float)(unif() - 0.5);
    if (n > 600) w[n - 1] = 0.25f; /* a long gap: filler symbols */
    r = dsz_encodeSparse(buf, cap, w, rows, cols, &p, codec);
    bad = dsz_isError(r) ? (fprintf(stderr, "%s: %s\n", name, dsz_getErrorName(r)), 1) : save(dir, name, buf, r);
    free(w);
    free(buf);
    return bad;
}

int main(int argc, char** argv)
{
    static const unsigned long long s1[1] = {200}, s2[2] = {12, 17}, s3[3] = {4, 5, 6}, s0[1] = {0};
    static const unsigned long long s8[8] = {2, 2, 2, 2, 2, 2, 2, 2};
    static const char* const codecs[3] = {"gap8", "huffgap", "bitmap"};
    char name[64];
    unsigned pred, c;
    int bad = 0;
    if (argc != 3) { fprintf(stderr, "usage: %s <array-dir> <sparse-dir>\n", argv[0]); return 2; }
    for (pred = DSZ_PRED_NONE; pred <= DSZ_PRED_LORENZO; pred++) {
        const char* const pn = pred ? "lorenzo" : "none";
        snprintf(name, sizeof(name), "%s_1d", pn); bad |= array_seed(argv[1], name, s1, 1, 1e-3, pred, 0, 0);
        snprintf(name, sizeof(name), "%s_2d", pn); bad |= array_seed(argv[1], name, s2, 2, 1e-2, pred, 0, 0);
        snprintf(name, sizeof(name), "%s_3d", pn); bad |= array_seed(argv[1], name, s3, 3, 1e-2, pred, 0, 1);
        snprintf(name, sizeof(name), "%s_8d", pn); bad |= array_seed(argv[1], name, s8, 8, 0.05, pred, 0, 0);
        snprintf(name, sizeof(name), "%s_radius2", pn); bad |= array_seed(argv[1], name, s1, 1, 1e-3, pred, 2, 1);
        snprintf(name, sizeof(name), "%s_coarse", pn); bad |= array_seed(argv[1], name, s2, 2, 10.0, pred, 0, 0);
        snprintf(name, sizeof(name), "%s_empty", pn); bad |= array_seed(argv[1], name, s0, 1, 1e-3, pred, 0, 0);
        for (c = DSZ_INDEX_GAP8; c <= DSZ_INDEX_BITMAP; c++) {
            snprintf(name, sizeof(name), "%s_%s_30x40", pn, codecs[c]);
            bad |= sparse_seed(argv[2], name, 30, 40, 0.1, 1e-2, pred, c);
            snprintf(name, sizeof(name), "%s_%s_4x700", pn, codecs[c]);
            bad |= sparse_seed(argv[2], name, 4, 700, 0.01, 1e-2, pred, c);
        }
    }
    for (c = DSZ_INDEX_GAP8; c <= DSZ_INDEX_BITMAP; c++) {
        snprintf(name, sizeof(name), "dense_%s_9x9", codecs[c]);
        bad |= sparse_seed(argv[2], name, 9, 9, 1.0, 1e-2, DSZ_PRED_LORENZO, c);
        snprintf(name, sizeof(name), "empty_%s_5x5", codecs[c]);
        bad |= sparse_seed(argv[2], name, 5, 5, 0.0, 1e-2, DSZ_PRED_NONE, c);
    }
    array_seed(argv[1], "scalar", s1, 0, 1e-3, DSZ_PRED_LORENZO, 0, 0);
    return bad;
}
