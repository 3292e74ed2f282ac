"""The lossless stage: a section of a frame wrapped by a general-purpose codec where that makes it
smaller (the frame header records which codec wraps which section, and its raw size), and unwrapped
without ever producing more than that raw size."""
from __future__ import annotations

import bz2
import lzma
import zlib

import numpy as np
import zstandard

from pydsz.errors import FormatError

# the frame's lossless codec ids (doc/format.md)
NONE, ZSTD, LZMA, BZ2, ZLIB = range(5)
NAMES = {0: "none", 1: "zstd", 2: "lzma", 3: "bz2", 4: "zlib"}


_CHUNK = 1 << 20
# the dictionary size of each xz preset (xz(1)); a section no larger is coded the same with a dictionary its size
_LZMA_PRESET_DICT = dict(enumerate(kib << 10 for kib in (256, 1024, 2048, 4096, 4096, 8192, 8192, 16384, 32768, 65536)))


def inflate(codec: int, data: np.ndarray, raw_size: int, what: str) -> np.ndarray:
    """Unwrap a section, never producing more than raw_size (+1 to detect excess) bytes."""
    if codec == NONE:
        return data
    name = NAMES[codec]
    limit = raw_size + 1
    try:
        if codec == ZSTD:
            parts, got = [], 0
            with zstandard.ZstdDecompressor(max_window_size=_window(raw_size)).stream_reader(data.tobytes()) as reader:
                while got < limit:
                    chunk = reader.read(min(_CHUNK, limit - got))
                    if not chunk:
                        break
                    parts.append(chunk)
                    got += len(chunk)
            out = b"".join(parts)
        else:
            dec = {LZMA: lambda: lzma.LZMADecompressor(memlimit=_lzma_memory(raw_size)),
                   BZ2: bz2.BZ2Decompressor, ZLIB: zlib.decompressobj}[codec]()
            out = dec.decompress(data.tobytes(), limit)
            if not dec.eof:
                raise ValueError("stream incomplete")
    except (zstandard.ZstdError, lzma.LZMAError, zlib.error, OSError, EOFError, ValueError) as e:
        raise FormatError(f"{what}: {name}-wrapped section does not decompress: {e}") from None
    if len(out) != raw_size:
        raise FormatError(f"{what}: {name}-wrapped section holds {len(out)} bytes, header declares {raw_size}")
    return np.frombuffer(out, dtype=np.uint8)


# What an untrusted section may make its decoder allocate: the window or dictionary its header
# declares, which need not be larger than the raw size the frame header gives (zstd writes a window
# of at least 1 KiB, at most the next power of two above the content; wrap's lzma a dictionary of at
# least 4 KiB, and files before Nov 2026 -9's 64 MiB), plus the decoder's own state.
def _window(raw_size: int) -> int:
    return min(max(1 << 10, 1 << max(raw_size - 1, 0).bit_length()), 1 << 27)  # 2^27: zstd's default limit


def _lzma_memory(raw_size: int) -> int:
    return max(raw_size, _LZMA_PRESET_DICT[9]) + (1 << 20)


def wrap(raw: bytes, codecs: tuple) -> tuple[int, bytes]:
    """The smallest of the raw section and its lossless compressions: (codec id, bytes)."""
    best = (NONE, raw)
    if not raw:
        return best
    for codec, level in codecs:
        if codec == ZSTD:
            packed = zstandard.ZstdCompressor(level=level).compress(raw)
        elif codec == LZMA:
            # the preset's dictionary cut to the section: the same LZMA2 data (only the header's
            # dictionary size differs), without setting up a 64 MiB dictionary's match finder for
            # every section (most of an assessment's time where candidates choose their index) or
            # decoding into one
            dictionary = min(max(len(raw), 4096), _LZMA_PRESET_DICT[level])  # 4 KiB: LZMA2's least
            packed = lzma.compress(raw, filters=[{"id": lzma.FILTER_LZMA2, "preset": level, "dict_size": dictionary}])
        elif codec == BZ2:
            packed = bz2.compress(raw, level)
        else:
            packed = zlib.compress(raw, level)
        if len(packed) < len(best[1]):
            best = (codec, packed)
    return best


# LZMA2's dictionary for lzma_tables: the raw size, at least LZMA2's least, at most 1 MiB. The encoder at
# preset 9 takes about 11 times it (180 MiB for a 16 MiB one, measured; 14 MiB for 1 MiB, within the
# codec's share of the memory bound), a device decoding takes it once; the rests of the zoo's .dsz
# files (the model's bytes outside its compressed tensors) are 20-40 KB
TABLES_DICT_MAX = 1 << 20


def _tables_dict(raw_size: int) -> int:
    return min(max(raw_size, 4096), TABLES_DICT_MAX)


def _tables_filters(raw_size: int) -> list:
    return [{"id": lzma.FILTER_LZMA2, "preset": 9, "dict_size": _tables_dict(raw_size), "lc": 0, "lp": 2, "pb": 2}]


def lzma_tables(raw: bytes) -> bytes:
    """Raw LZMA2 (no .xz container: 56 bytes fewer) at preset 9 with the literal and position contexts
    set for tables of 4-byte fields (a .tflite's flatbuffer, the .dsz table: offsets, shapes, vtables;
    lc=0 lp=2 pb=2): on the rests of 11 zoo models' .dsz files up to 4.1% smaller than xz -9 (+1.0% at
    worst). The dictionary follows from the raw size (TABLES_DICT_MAX), which the reader knows: no size a
    file declares decides what its decoder allocates."""
    return lzma.compress(raw, format=lzma.FORMAT_RAW, filters=_tables_filters(len(raw)))


def inflate_tables(data, raw_size: int, what: str, declared: str) -> bytes:
    """lzma_tables' output of exactly raw_size bytes, its end marker at the data's end; a FormatError
    naming `what` (and, for a wrong size, what `declared` the size) otherwise."""
    dec = lzma.LZMADecompressor(lzma.FORMAT_RAW, filters=[{"id": lzma.FILTER_LZMA2,
                                                            "dict_size": _tables_dict(raw_size)}])
    try:
        raw = dec.decompress(bytes(data), raw_size + 1)
        if len(raw) == raw_size and not dec.eof:
            raw += dec.decompress(b"", 1)  # the end marker, or a byte too many
    except (lzma.LZMAError, EOFError) as exc:
        raise FormatError(f"{what} does not decompress: {exc}") from None
    if len(raw) < raw_size:
        raise FormatError(f"{what} holds {len(raw)} bytes{'' if dec.eof else ' and no end marker'}, {declared}")
    if len(raw) > raw_size or dec.unused_data:
        after = ": bytes after its LZMA2 stream" if dec.unused_data else ""
        raise FormatError(f"{what} holds more than {raw_size} bytes{after}, {declared}")
    if not dec.eof:
        raise FormatError(f"{what} ends before its end marker (no end marker after {raw_size} bytes)")
    return raw


DATA_WRAPPERS = ((ZSTD, 3),)


def gap8_wrappers(size: int) -> tuple:
    """DeepSZ's candidates for the gap bytes; the slow ones only on small sections."""
    if size <= 1 << 20:
        return tuple((ZSTD, lv) for lv in (3, 9, 19, 22)) + ((LZMA, 9), (BZ2, 9), (ZLIB, 9))
    return ((ZSTD, 3), (ZSTD, 9), (BZ2, 9), (ZLIB, 9))
