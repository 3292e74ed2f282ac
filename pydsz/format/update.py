"""Reading and applying a model update (.dszu): from the model a device holds to a new one.

An update is coded against its base as the device decodes it (pydsz.compress.diff chooses its
bounds, pydsz.encode.update writes it): each changed layer either as its difference from the base's
values, which dsz_decodeArrayDelta adds to them in one pass (a float32 array frame within the
layer's bound), or afresh (the codec's stream of the new values); the rest of the new model's bytes
(the entries' places zeroed) as a zstd frame whose dictionary is the base itself, so that what did
not change costs next to nothing. The update names its base and its result by their SHA-256: a
wrong base is refused before anything is written, and the bytes a device ends with are those the
server computed. doc/format.md specifies the bytes; every byte read here is untrusted.
"""
from __future__ import annotations

import hashlib
import math
import os
import struct
from dataclasses import dataclass

import numpy as np
import zstandard

from pydsz import _core
from pydsz.errors import DszError, FormatError, InputError
from pydsz.format import codec, delta
from pydsz.format.container import CRC, DTYPES, MAGIC, crc, load
from pydsz.format.files import read_file

UPDATE_MAGIC = b"DSZU"
UPDATE_VERSION = 1
# magic, version, flags, base sha256, result sha256, result bytes, entries, table bytes, rest bytes,
# streams bytes
UPDATE_HEADER = struct.Struct("<4sHH32s32sQIIQQ")
# place in the result, place in the base, bytes, kind, dtype, ndim, reserved, bound, stream bytes, name bytes
UPDATE_ENTRY = struct.Struct("<QQQBBBBdQH")
# delta: a float32 array frame added to the base's values; dense, sparse: the codec's stream of the new
# values; model: a whole .dsz whose decoded bytes fill the place (an update cheaper shipped whole)
KINDS = {0: "delta", 1: "dense", 2: "sparse", 3: "model"}
# the base's rest as the dictionary of the result's: zstd reads matches that far back
WINDOW_LOG_MAX = 31
_MAX_NDIM = 8
_ZSTD_MAX_RATIO = 32768


@dataclass(frozen=True)
class UpdateEntry:
    """One changed tensor (or the whole model): where its bytes go in the result and come from in the
    base, and its stream (KINDS)."""

    name: str
    offset: int
    base_offset: int
    nbytes: int
    kind: str
    dtype: str
    shape: tuple
    bound: float
    stream: bytes


def sha256(data) -> bytes:
    return hashlib.sha256(data).digest()


def holes_zeroed(data: bytes, places) -> bytes:
    """`data` with the byte ranges (start, end) of `places` zeroed: the rest of a model, as an update
    codes it."""
    out = bytearray(data)
    for start, end in places:
        out[start:end] = bytes(end - start)
    return bytes(out)


def window_log(size: int) -> int:
    """The zstd window that reaches back over a dictionary of `size` bytes and the frame itself."""
    return min(WINDOW_LOG_MAX, max(20, math.ceil(math.log2(max(size, 1))) + 1))


class Update:
    """A .dszu opened for applying: its base's and result's hashes, its entries, the rest's frame."""

    def __init__(self, buf):
        mv = memoryview(buf).cast("B")
        if len(mv) < len(UPDATE_MAGIC) and UPDATE_MAGIC.startswith(bytes(mv)):
            raise FormatError(f"truncated update: {len(mv)} bytes is shorter than its header")
        if len(mv) < 4 or bytes(mv[:4]) != UPDATE_MAGIC:
            raise FormatError("not a model update: wrong magic (expected 'DSZU')")
        if len(mv) < UPDATE_HEADER.size + 2 * CRC.size:
            raise FormatError(f"truncated update: {len(mv)} bytes is shorter than its header")
        (_, version, flags, self.base_sha256, self.result_sha256, self.model_bytes, n, table_bytes, rest_bytes,
         streams_bytes) = UPDATE_HEADER.unpack(mv[:UPDATE_HEADER.size])
        if version == 0 or version > UPDATE_VERSION:
            raise FormatError(f"update format version {version}: this reader reads 1..{UPDATE_VERSION}")
        head_end = UPDATE_HEADER.size + table_bytes
        expected = head_end + CRC.size + rest_bytes + streams_bytes + CRC.size
        if len(mv) != expected:
            raise FormatError(f"the update is {len(mv)} bytes, its header declares {expected}: truncated or extended")
        if crc(mv[:head_end]) != CRC.unpack(mv[head_end:head_end + CRC.size])[0]:
            raise FormatError("checksum mismatch in the update's header or table: the file is corrupt")
        if crc(mv[:expected - CRC.size]) != CRC.unpack(mv[expected - CRC.size:])[0]:
            raise FormatError("checksum mismatch over the update: the file is corrupt")
        if flags:
            raise FormatError(f"update header flags {flags:#x}: reserved bits must be zero")
        if self.model_bytes > _ZSTD_MAX_RATIO * max(rest_bytes, 1):
            raise FormatError(f"the update declares a model of {self.model_bytes} bytes, more than its rest of "
                              f"{rest_bytes} bytes can hold")
        self.rest = bytes(mv[head_end + CRC.size:head_end + CRC.size + rest_bytes])
        self.entries = self._table(mv, UPDATE_HEADER.size, head_end, n, head_end + CRC.size + rest_bytes,
                                   expected - CRC.size)

    def _table(self, mv, pos: int, end: int, n: int, streams: int, streams_end: int) -> list:
        entries, places = [], []
        for i in range(n):
            if pos + UPDATE_ENTRY.size > end:
                raise FormatError(f"update entry {i}: the table is truncated")
            offset, base_offset, nbytes, kind, dtype, ndim, reserved, bound, size, name_len = \
                UPDATE_ENTRY.unpack(mv[pos:pos + UPDATE_ENTRY.size])
            pos += UPDATE_ENTRY.size
            if kind not in KINDS or dtype not in DTYPES or reserved or ndim > _MAX_NDIM \
                    or (KINDS[kind] == "delta" and DTYPES[dtype] != "float32") \
                    or (KINDS[kind] == "model" and DTYPES[dtype] != "uint8"):
                raise FormatError(f"update entry {i}: unknown kind, dtype or reserved field")
            if pos + 8 * ndim + name_len > end:
                raise FormatError(f"update entry {i}: the table is truncated")
            shape = struct.unpack(f"<{ndim}Q", mv[pos:pos + 8 * ndim])
            pos += 8 * ndim
            name = bytes(mv[pos:pos + name_len]).decode("utf-8", "replace")
            pos += name_len
            codec.check_shape(shape, f"update entry {name}")
            if math.prod(shape) * np.dtype(DTYPES[dtype]).itemsize != nbytes or offset + nbytes > self.model_bytes:
                raise FormatError(f"update entry {name}: shape {shape} or place [{offset}, +{nbytes}) does not fit "
                                  f"a model of {self.model_bytes} bytes")
            if not (math.isfinite(bound) and bound >= 0):
                raise FormatError(f"update entry {name}: bound {bound} is not a number >= 0")
            if streams + size > streams_end:
                raise FormatError(f"update entry {name}: its stream runs past the end of the update")
            entries.append(UpdateEntry(name, offset, base_offset, nbytes, KINDS[kind], DTYPES[dtype], tuple(shape),
                                       bound, bytes(mv[streams:streams + size])))
            streams += size
            places.append((offset, offset + nbytes))
        if pos != end or streams != streams_end:
            raise FormatError("the update's table sizes do not add up to its declared sections")
        places.sort()
        if any(a_end > b_start for (_, a_end), (b_start, _) in zip(places, places[1:])):
            raise FormatError("update table: two entries overlap in the model")
        return entries

    def apply(self, base: bytes) -> bytes:
        """The new model's bytes from the base's (the decoded .tflite a device holds). FormatError where
        the base is another model than the one the update was made for, or the result is not the
        bytes the update was made to give."""
        base = bytes(base)
        if sha256(base) != self.base_sha256:
            raise FormatError("this update was made for another model than the base given (their SHA-256 differ): "
                              "apply it to the model it was made from")
        for e in self.entries:
            if e.kind == "delta" and e.base_offset + e.nbytes > len(base):
                raise FormatError(f"update entry {e.name}: its place in the base runs past the base's "
                                  f"{len(base)} bytes")
        try:
            writer = _core.BytesWriter(self.model_bytes)
        except MemoryError:
            raise DszError(f"not enough memory to build a model of {self.model_bytes} bytes") from None
        out = np.frombuffer(writer, np.uint8)
        self._inflate_rest(base, out)
        fill(out, base, self.entries)
        del out
        result = writer.take()
        if sha256(result) != self.result_sha256:
            raise FormatError("the patched model is not the one the update was made to give (SHA-256 differs): "
                              "the update or the base is damaged")
        return result

    def _inflate_rest(self, dictionary: bytes, out: np.ndarray) -> None:
        """Inflate the rest straight into `out` (the result's bytes): no second copy of the model, and
        a window no larger than the base and the result need, whatever the frame declares."""
        window = min(1 << WINDOW_LOG_MAX, 1 << window_log(len(dictionary) + len(out)))
        try:
            zdict = zstandard.ZstdCompressionDict(dictionary, dict_type=zstandard.DICT_TYPE_RAWCONTENT)
            dctx = zstandard.ZstdDecompressor(dict_data=zdict, max_window_size=window)
            with dctx.stream_reader(self.rest, read_across_frames=False) as reader:
                view, got = memoryview(out), 0
                while got < len(out):
                    step = reader.readinto(view[got:])
                    if not step:
                        break
                    got += step
                view.release()
                extra = reader.read(1)
        except zstandard.ZstdError as exc:
            raise FormatError(f"the update's rest does not decompress against the base: {exc}") from None
        except MemoryError:
            raise DszError("not enough memory to decompress the update's rest") from None
        if got != len(out) or extra:
            raise FormatError(f"the update's rest holds {'more' if extra else got} bytes, its header declares "
                              f"{len(out)}")


def fill(out: np.ndarray, base: bytes, entries: list) -> None:
    """Write each entry's values into its place of `out` (the result's bytes, uint8): a difference
    added to the base's values at its place in the base, or the values decoded afresh."""
    source = np.frombuffer(base, np.uint8)
    for e in entries:
        try:
            if e.kind == "delta":
                held = np.frombuffer(source[e.base_offset:e.base_offset + e.nbytes].tobytes(), "<f4")
                values = delta.decode(e.stream, held)
            elif e.kind == "model":
                values = np.frombuffer(load(e.stream).tflite_bytes(), np.uint8)
            elif e.kind == "dense":
                values = codec.decompress_array(e.stream)
            else:
                values = codec.decode_sparse(e.stream)
        except DszError as exc:
            raise FormatError(f"update entry {e.name}: {exc}") from None
        if values.dtype != np.dtype(e.dtype) or values.size * values.itemsize != e.nbytes:
            raise FormatError(f"update entry {e.name}: its stream decodes to {values.dtype} {values.shape}, "
                              f"the table says {e.dtype} {e.shape}")
        out[e.offset:e.offset + e.nbytes] = np.ascontiguousarray(values).reshape(-1).view(np.uint8)


def load_update(path_or_bytes) -> Update:
    """Open a .dszu from a path or bytes."""
    if isinstance(path_or_bytes, (str, os.PathLike)):
        data = read_file(path_or_bytes)
        try:
            return Update(data)
        except FormatError as exc:
            raise FormatError(f"{path_or_bytes}: {exc}") from None
    return Update(path_or_bytes)


def held_model(path_or_bytes) -> bytes:
    """The .tflite bytes a device holds: a .tflite's own, or a .dsz's decoded."""
    data = read_file(path_or_bytes) if isinstance(path_or_bytes, (str, os.PathLike)) else bytes(path_or_bytes)
    if data[:4] == MAGIC:
        return load(data).tflite_bytes()
    if len(data) < 8 or data[4:8] != b"TFL3":
        raise InputError(f"{path_or_bytes if isinstance(path_or_bytes, (str, os.PathLike)) else 'the base'}: "
                         "neither a .dsz nor a .tflite model")
    return data


def patch(base, update) -> bytes:
    """The new model's .tflite bytes: `update` (a .dszu's path or bytes, or an Update) applied to
    `base` (the .dsz or .tflite the device holds, as a path or bytes)."""
    opened = update if isinstance(update, Update) else load_update(update)
    return opened.apply(held_model(base))
