/* Shared by the fuzz targets: a failed property check aborts (libFuzzer reports it as a crash
 * and saves the input), and buffers are allocated at their exact size so that ASan catches a
 * write one value past the end. */
#ifndef DSZ_FUZZ_COMMON_H
#define DSZ_FUZZ_COMMON_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* the harnesses drive the section-level decoders of the experimental API */
#define DSZ_STATIC_LINKING_ONLY
#include "dsz.h"

#define FUZZ_CHECK(cond, ...)                                                     \
    do {                                                                          \
        if (!(cond)) {                                                            \
            fprintf(stderr, "%s:%d: check failed: %s: ", __FILE__, __LINE__, #cond); \
            fprintf(stderr, __VA_ARGS__);                                         \
            fputc('\n', stderr);                                                  \
            abort();                                                              \
        }                                                                         \
    } while (0)

/* the call returned exactly this error */
#define FUZZ_CHECK_ERROR(r, code) \
    FUZZ_CHECK(dsz_getErrorCode(r) == (code), "got %s, expected %s", dsz_getErrorName(r), #code)

/* n float32 values, at least one byte so that malloc(0) never returns NULL */
static inline float* fuzz_floats(size_t n, int zeroed)
{
    size_t const bytes = n ? n * sizeof(float) : 1;
    void* const p = zeroed ? calloc(bytes, 1) : malloc(bytes);
    if (!p) abort(); /* the harness caps sizes: running out is a harness bug */
    return (float*)p;
}

/* a parameter object holding an input's choices (free it with dsz_freeParams); every harness
   picks values the encoders take, so a refused one is a harness bug */
static inline dsz_params* fuzz_params(double eb, unsigned mode, unsigned predictor, unsigned radius)
{
    dsz_params* const p = dsz_createParams();
    size_t r;
    if (!p) abort();
    r = dsz_params_setParameter(p, dsz_p_errorBound, eb);
    FUZZ_CHECK(r == 0, "error bound %g: %s", eb, dsz_getErrorName(r));
    r = dsz_params_setParameter(p, dsz_p_mode, mode);
    FUZZ_CHECK(r == 0, "mode %u: %s", mode, dsz_getErrorName(r));
    r = dsz_params_setParameter(p, dsz_p_predictor, predictor);
    FUZZ_CHECK(r == 0, "predictor %u: %s", predictor, dsz_getErrorName(r));
    r = dsz_params_setParameter(p, dsz_p_radius, radius);
    FUZZ_CHECK(r == 0, "radius %u: %s", radius, dsz_getErrorName(r));
    return p;
}

#endif /* DSZ_FUZZ_COMMON_H */
