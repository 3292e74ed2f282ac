/* Fuzz target: the sparse decoder entry points (dsz_getFrameInfo, dsz_decodeSparse) on
 * untrusted bytes, for every index codec the header names. Only frames whose sections are
 * stored raw are decoded: libdsz reads no lossless wrapper itself. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "dsz.h"

/* keep each input's output buffer small enough that the fuzzer does not run out of memory */
#define MAX_VALUES (1u << 24)

int LLVMFuzzerTestOneInput(const uint8_t* src, size_t size)
{
    dsz_frameInfo info;
    float* dst;
    const uint8_t* data;
    size_t avail;
    unsigned codec;
    size_t const hs = dsz_getFrameInfo(&info, src, size);
    if (dsz_isError(hs) || info.kind != DSZ_KIND_SPARSE) return 0;
    if (info.dataLossless != DSZ_LOSSLESS_NONE || info.indexLossless != DSZ_LOSSLESS_NONE) return 0;
    if (info.nElements > MAX_VALUES) return 0;
    data = src + hs;
    avail = size - hs;
    if (avail < info.dataRawSize || avail - info.dataRawSize < info.indexRawSize) return 0;
    dst = (float*)malloc(((size_t)info.nElements + 1) * sizeof(float));
    if (!dst) return 0;
    /* the frame's own index codec first, then the same sections read under the other codecs */
    for (codec = 0; codec <= DSZ_INDEX_BITMAP; codec++) {
        dsz_frameInfo g = info;
        g.indexCodec = (info.indexCodec + codec) % (DSZ_INDEX_BITMAP + 1);
        memset(dst, 0, ((size_t)info.nElements + 1) * sizeof(float));
        (void)dsz_decodeSparse(dst, (size_t)info.nElements, &g, data, (size_t)info.dataRawSize,
                               data + info.dataRawSize, (size_t)info.indexRawSize);
    }
    free(dst);
    return 0;
}
