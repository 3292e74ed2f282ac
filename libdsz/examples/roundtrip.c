/* Compress an array within an absolute error bound and decode it again, through libdsz's stable
 * API. Build: cc -Iinclude examples/roundtrip.c -Lbuild -ldsz -lm (make example). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "dsz.h"

/* print a libdsz error and tell whether there was one */
static int failed(size_t r, const char* what)
{
    if (!dsz_isError(r)) return 0;
    fprintf(stderr, "%s: %s\n", what, dsz_getErrorName(r));
    return 1;
}

int main(void)
{
    enum { N = 100000 };
    double const bound = 1e-3;
    unsigned long long const shape[1] = {N};
    float* const x = (float*)malloc(N * sizeof(float));
    float* const y = (float*)malloc(N * sizeof(float));
    size_t const cap = dsz_compressBound(N, 0);
    void* const frame = malloc(cap);
    dsz_params* const params = dsz_createParams();
    double worst = 0;
    size_t size, n, i;
    int bad = !x || !y || !frame || !params || dsz_isError(cap);
    if (bad) {
        fprintf(stderr, "out of memory\n");
        return 1;
    }
    for (i = 0; i < N; i++) x[i] = (float)(sin(i * 0.001) + 0.01 * cos(i * 0.37));

    bad = failed(dsz_params_setParameter(params, dsz_p_errorBound, bound), "error bound")
          || failed(dsz_params_setParameter(params, dsz_p_predictor, DSZ_PRED_LORENZO), "predictor");
    size = bad ? 0 : dsz_compress(frame, cap, x, shape, 1, params);
    bad = bad || failed(size, "compress");
    n = bad ? 0 : dsz_decompress(y, N, frame, size);
    bad = bad || failed(n, "decompress");
    if (!bad) {
        for (i = 0; i < n; i++) worst = fmax(worst, fabs((double)x[i] - (double)y[i]));
        printf("%d floats -> %zu bytes (%.1fx), largest error %.3g <= %g\n", N, size,
               (double)(N * sizeof(float)) / (double)size, worst, bound);
        bad = n != N || worst > bound;
    }
    dsz_freeParams(params);
    free(frame);
    free(y);
    free(x);
    return bad;
}
