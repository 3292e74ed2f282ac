"""Writing a model update (.dszu; pydsz.format.update reads and applies it, doc/format.md): the
changed tensors' streams and places, the rest of the new model as a zstd frame against the base."""
from __future__ import annotations

import struct

import zstandard

from pydsz.format.container import CRC, DTYPES, crc
from pydsz.format.update import (
    KINDS,
    UPDATE_ENTRY,
    UPDATE_HEADER,
    UPDATE_MAGIC,
    UPDATE_VERSION,
    UpdateEntry,
    holes_zeroed,
    sha256,
    window_log,
)

_KIND_CODES = {v: k for k, v in KINDS.items()}
_DTYPE_CODES = {v: k for k, v in DTYPES.items()}
_LEVEL = 19


def rest_frame(base: bytes, new: bytes, entries: list[UpdateEntry]) -> bytes:
    """The new model's bytes with the entries' places zeroed, as a zstd frame whose dictionary is the
    base (zstd --patch-from's idea): the bytes that did not change cost next to nothing."""
    rest = holes_zeroed(new, [(e.offset, e.offset + e.nbytes) for e in entries])
    zdict = zstandard.ZstdCompressionDict(bytes(base), dict_type=zstandard.DICT_TYPE_RAWCONTENT)
    params = zstandard.ZstdCompressionParameters.from_level(
        _LEVEL, window_log=window_log(len(base) + len(rest)), enable_ldm=len(base) > 1 << 24, write_checksum=True)
    return zstandard.ZstdCompressor(compression_params=params, dict_data=zdict).compress(rest)


def write_whole(base: bytes, dsz: bytes, result: bytes) -> bytes:
    """The .dszu that carries a whole .dsz (decoding to `result`) for the device holding `base`."""
    whole = UpdateEntry("model", 0, 0, len(result), "model", "uint8", (len(result),), 0.0, bytes(dsz))
    return write(base, result, result, [whole])


def write(base: bytes, new: bytes, result: bytes, entries: list[UpdateEntry]) -> bytes:
    """The .dszu bytes that turn `base` (the decoded model a device holds) into `result` (the bytes
    the device will have: `new` with the entries' decoded values in their places)."""
    rest = rest_frame(base, new, entries)
    table = bytearray()
    for e in entries:
        name = e.name.encode()
        table += UPDATE_ENTRY.pack(e.offset, e.base_offset, e.nbytes, _KIND_CODES[e.kind], _DTYPE_CODES[e.dtype],
                                   len(e.shape), 0, e.bound, len(e.stream), len(name))
        table += struct.pack(f"<{len(e.shape)}Q", *e.shape) + name
    streams = b"".join(e.stream for e in entries)
    head = UPDATE_HEADER.pack(UPDATE_MAGIC, UPDATE_VERSION, 0, sha256(base), sha256(result), len(result), len(entries),
                              len(table), len(rest), len(streams)) + bytes(table)
    body = head + CRC.pack(crc(head)) + rest + streams
    return body + CRC.pack(crc(body))
