/* Compress an array within an absolute error bound and decode it, through libdsz's stable API.
 * Build: cc -Iinclude examples/roundtrip.c -Lbuild -ldsz -lm (what `make example` does). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "dsz.h"

#define N 100000

/* stop on a libdsz error, naming it */
static size_t check(size_t r, const char* what)
{
    if (dsz_isError(r)) {
        fprintf(stderr, "%s: %s\n", what, dsz_getErrorName(r));
        exit(1);
    }
    return r;
}

int main(void)
{
    static float x[N], y[N];
    unsigned long long const shape[1] = {N};
    double const bound = 1e-3;
    double worst = 0;
    size_t const cap = check(dsz_compressBound(N, 0), "bound");
    void* const frame = malloc(cap);
    dsz_params* const params = dsz_createParams(); /* the one object libdsz allocates for you */
    size_t size, i;
    if (!frame || !params) return 1;
    for (i = 0; i < N; i++) x[i] = (float)(sin(i * 0.001) + 0.01 * cos(i * 0.37));

    check(dsz_params_setParameter(params, dsz_p_errorBound, bound), "error bound");
    check(dsz_params_setParameter(params, dsz_p_predictor, DSZ_PRED_LORENZO), "predictor");
    size = check(dsz_compress(frame, cap, x, shape, 1, params), "compress");
    check(dsz_decompress(y, N, frame, size), "decompress");

    for (i = 0; i < N; i++) {
        double const e = fabs((double)x[i] - (double)y[i]);
        if (e > worst) worst = e;
    }
    printf("%d floats -> %zu bytes (%.1fx), largest error %.3g <= %g\n", N, size,
           N * sizeof(float) / (double)size, worst, bound);
    dsz_freeParams(params);
    free(frame);
    return worst > bound;
}
