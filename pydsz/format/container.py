"""Reading the .dsz model container: a whole .tflite model with its weight tensors error-bounded
compressed (pydsz.encode.pack writes it).

The model's bytes, with every compressed tensor's bytes zeroed, are kept losslessly with zstd (the
zero runs cost next to nothing); a table says where each compressed tensor lives in the model file
and holds the codec stream that rebuilds it. Decoding needs no flatbuffer parser: inflate the rest,
then decode every tensor into its place. doc/format.md specifies the bytes; every byte read here is
untrusted.
"""
from __future__ import annotations

import math
import os
import struct
import zlib
from dataclasses import dataclass

import numpy as np
import zstandard

from pydsz import _core
from pydsz.errors import DszError, FormatError
from pydsz.format import codec, spans
from pydsz.format.files import read_file
from pydsz.format.interpreter import make_interpreter
from pydsz.format.wrapping import inflate_tables

MAGIC = b"DSZM"
# newest container version; a file is written with the oldest version that holds it: 1 when every
# compressed tensor is float32 (readers from before stored dtypes keep reading such files), 2 when
# one is float16, int8 or uint8 (those readers then refuse the file, naming the version), 3 when it
# holds a gathered entry (several small tensors decoded from one stream: pydsz.format.spans), 4 when
# its table or its rest is LZMA2 (the flags)
FORMAT_VERSION = 4
# the header's flags (version 4): the rest is raw LZMA2 (pydsz.format.wrapping.lzma_tables) of the model's
# bytes outside the compressed tensors, not a zstd frame of them all, only for models of at most
# LZMA_REST_MAX bytes, which bounds what a small file makes a reader allocate; the table is raw LZMA2,
# after its raw size (u32), at most TABLE_GROWTH times its stored size and 64 KiB
REST_LZMA, TABLE_LZMA = 1, 2
LZMA_REST_MAX = 16 << 20
TABLE_GROWTH = 256
# magic, version, flags, n_tensors, table bytes, model bytes, rest bytes, streams bytes
HEADER = struct.Struct("<4sHHIIQQQ")
# offset, nbytes, buffer index, representation, dtype, ndim, reserved, bound, stream bytes, name bytes
ENTRY = struct.Struct("<QQIBBBBdQH")
CRC = struct.Struct("<I")
_MAX_NDIM = 8
REPRESENTATIONS = {0: "dense", 1: "sparse", 2: "gathered"}
# the table's dtype codes: the dtype a tensor is stored in, in the model and in its stream
DTYPES = {0: "float32", 1: "float16", 2: "int8", 3: "uint8"}
# a zstd block inflates to at most 128 KiB and takes at least 4 bytes (an RLE block)
_ZSTD_MAX_RATIO = 32768
_INFLATE_CHUNK = 1 << 18  # bytes inflated at a time: small enough to stay in the CPU's cache


@dataclass(frozen=True)
class TensorEntry:
    """One compressed tensor: where its bytes go in the model file and the stream that rebuilds them."""

    name: str
    buffer_index: int
    offset: int
    nbytes: int
    shape: tuple
    representation: str
    error_bound: float  # absolute; whole quantization steps for int8 and uint8
    stream: bytes
    dtype: str = "float32"  # the stored dtype (DTYPES)
    # "gathered": the stream's values, in order, fill these (offset, count, step) places of the model
    # (pydsz.encode.gather); the entry's offset is the first one's and nbytes their total
    spans: tuple = ()

    @property
    def itemsize(self) -> int:
        return np.dtype(self.dtype).itemsize

    @property
    def holes(self) -> list:
        """The (start, end) byte ranges of the model that this entry's values fill."""
        if self.representation == "gathered":
            return [(offset, offset + count * self.itemsize) for offset, count, _ in self.spans]
        return [(self.offset, self.offset + self.nbytes)]


def crc(data) -> int:
    return zlib.crc32(data) & 0xFFFFFFFF
































class _Reader:
    """Bounds-checked little-endian reads from an untrusted buffer."""

    def __init__(self, buf: memoryview, pos: int, end: int, what: str):
        self.buf, self.pos, self.end, self.what = buf, pos, end, what

    def take(self, n: int) -> memoryview:
        if n < 0 or self.pos + n > self.end:
            raise FormatError(f"{self.what}: truncated at byte {self.pos} (needs {n} more bytes)")
        out = self.buf[self.pos:self.pos + n]
        self.pos += n
        return out

    def unpack(self, fmt: struct.Struct) -> tuple:
        return fmt.unpack(self.take(fmt.size))


def _inflated_table(stored: memoryview) -> tuple[memoryview, int, int]:
    """A TABLE_LZMA table: (its bytes, start, end) for _Reader."""
    if len(stored) < 4:
        raise FormatError(f"tensor table: {len(stored)} bytes cannot hold its raw size")
    (raw_size,) = struct.unpack("<I", stored[:4])
    if raw_size > TABLE_GROWTH * len(stored) + (64 << 10):
        raise FormatError(f"tensor table: {raw_size} bytes declared for {len(stored)} stored, more than LZMA2 "
                          "makes of a table")
    raw = inflate_tables(stored[4:], raw_size, "tensor table: its LZMA2 stream", f"its raw size says {raw_size}")
    return memoryview(raw), 0, raw_size


def _parse(buf) -> tuple[int, int, memoryview, str, list[TensorEntry]]:
    """Check magic, version, sizes and checksums, then read the table; returns (version, model size,
    rest, its codec, entries)."""
    mv = memoryview(buf).cast("B")
    if len(mv) < len(MAGIC) and MAGIC.startswith(bytes(mv)):
        raise FormatError(f"truncated .dsz file: {len(mv)} bytes is shorter than its header")
    if len(mv) < 4 or bytes(mv[:4]) != MAGIC:
        raise FormatError("not a .dsz model file: wrong magic (expected 'DSZM')")
    if len(mv) < HEADER.size + 2 * CRC.size:
        raise FormatError(f"truncated .dsz file: {len(mv)} bytes is shorter than its header")
    magic, version, flags, n_tensors, table_bytes, model_bytes, rest_bytes, streams_bytes = \
        HEADER.unpack(mv[:HEADER.size])
    if version > FORMAT_VERSION:
        raise FormatError(f".dsz format version {version} is newer than this reader's ({FORMAT_VERSION}): "
                          "upgrade pydsz")
    if version == 0:
        raise FormatError(".dsz format version 0 is not valid")
    head_end = HEADER.size + table_bytes
    expected = head_end + CRC.size + rest_bytes + streams_bytes + CRC.size
    if len(mv) < expected:
        raise FormatError(f"truncated .dsz file: {len(mv)} bytes, its header declares {expected}")
    if len(mv) > expected:
        raise FormatError(f".dsz file has {len(mv) - expected} unexpected bytes after its end")
    (head_crc,) = CRC.unpack(mv[head_end:head_end + CRC.size])
    if crc(mv[:head_end]) != head_crc:
        raise FormatError("checksum mismatch in the .dsz header or tensor table: the file is corrupt")
    (file_crc,) = CRC.unpack(mv[expected - CRC.size:expected])
    if crc(mv[:expected - CRC.size]) != file_crc:
        raise FormatError("checksum mismatch over the .dsz file: the file is corrupt")
    if flags & ~(REST_LZMA | TABLE_LZMA) or (flags and version < 4):
        raise FormatError(f".dsz header flags {flags:#x}: reserved bits must be zero")
    if flags & REST_LZMA and model_bytes > LZMA_REST_MAX:
        raise FormatError(f"the header declares a model of {model_bytes} bytes with an LZMA2 rest, which only "
                          f"models of at most {LZMA_REST_MAX} bytes may have")

    where = _inflated_table(mv[HEADER.size:head_end]) if flags & TABLE_LZMA else (mv, HEADER.size, head_end)
    table = _Reader(*where, "tensor table")
    entries = []
    stream_pos = head_end + CRC.size + rest_bytes
    stream_end = stream_pos + streams_bytes
    for i in range(n_tensors):
        offset, nbytes, buffer_index, rep, dtype, ndim, reserved, bound, stream_bytes, name_len = \
            table.unpack(ENTRY)
        # a version-1 file holds float32 tensors only: stored dtypes came with version 2
        if rep not in REPRESENTATIONS or dtype not in DTYPES or (version < 2 and dtype != 0) \
                or (version < 3 and rep == 2) or reserved != 0 or ndim > _MAX_NDIM:
            raise FormatError(f"tensor {i}: unknown representation, dtype or reserved field")
        shape = struct.unpack(f"<{ndim}Q", table.take(8 * ndim))
        name = bytes(table.take(name_len)).decode("utf-8", "replace")
        codec.check_shape(shape, f"tensor {name}")
        places = spans.read_spans(table.unpack, f"tensor {name}", ndim, math.prod(shape), DTYPES[dtype], offset,
                                  model_bytes) if rep == 2 else ()
        if math.prod(shape) * np.dtype(DTYPES[dtype]).itemsize != nbytes \
                or (not places and offset + nbytes > model_bytes):
            raise FormatError(f"tensor {name}: shape {shape} or place [{offset}, +{nbytes}) "
                              f"does not fit a model of {model_bytes} bytes")
        if stream_pos + stream_bytes > stream_end:
            raise FormatError(f"tensor {name}: stream runs past the end of the stream section")
        stream = bytes(mv[stream_pos:stream_pos + stream_bytes])
        stream_pos += stream_bytes
        entries.append(TensorEntry(name, buffer_index, offset, nbytes, tuple(shape),
                                   REPRESENTATIONS[rep], bound, stream, DTYPES[dtype], places))
    if table.pos != table.end or stream_pos != stream_end:
        raise FormatError("tensor table sizes do not add up to the declared section sizes")
    holes = sorted(hole for e in entries for hole in e.holes)
    if any(a_end > b_start for (_, a_end), (b_start, _) in zip(holes, holes[1:])):
        raise FormatError("tensor table: two tensors overlap in the model file")
    rest = mv[head_end + CRC.size:head_end + CRC.size + rest_bytes]
    if flags & REST_LZMA:
        return version, model_bytes, rest, "lzma", entries  # inflating it checks its size
    # the model's size decides an allocation: check it against what the rest can hold first
    if model_bytes > _ZSTD_MAX_RATIO * rest_bytes:
        raise FormatError(f"the header declares a model of {model_bytes} bytes, more than a zstd frame "
                          f"of {rest_bytes} bytes can hold")
    try:
        declared = zstandard.frame_content_size(rest)
    except zstandard.ZstdError as exc:
        raise FormatError(f"the model's lossless section is not a zstd frame: {exc}") from None
    if declared != model_bytes:
        raise FormatError(f"the model's lossless section declares {declared} bytes, the header {model_bytes}")
    return version, model_bytes, rest, "zstd", entries


def kept(model_bytes: int, holes: list) -> list[tuple[int, int]]:
    """The (start, end) ranges of a model's bytes outside the compressed tensors' holes: what only the
    rest provides."""
    keep, pos = [], 0
    for start, end in sorted(holes):
        if start > pos:
            keep.append((pos, start))
        pos = max(pos, end)
    if pos < model_bytes:
        keep.append((pos, model_bytes))
    return keep


def _decode_tensor(e: TensorEntry, out: np.ndarray | None = None) -> np.ndarray:
    """Decode one tensor's stream, into `out` (e.dtype, e.shape) when given."""
    decode = codec.decode_sparse if e.representation == "sparse" else codec.decompress_array
    try:
        w = decode(e.stream, out=out)
    except ValueError as exc:  # `out` does not match what the stream declares
        raise FormatError(f"tensor {e.name}: {exc}; the table says {e.dtype} {e.shape}") from None
    except DszError as exc:
        raise FormatError(f"tensor {e.name}: {exc}") from None
    if w.size * e.itemsize != e.nbytes or w.dtype != np.dtype(e.dtype):
        raise FormatError(f"tensor {e.name}: stream decodes to {w.dtype} {w.shape}, table says {e.dtype} {e.shape}")
    return w.reshape(e.shape)


def tensor_place(out: np.ndarray, e: TensorEntry) -> np.ndarray | None:
    """The view of tensor e's bytes in out (the model, uint8) as its stored dtype, or None where a
    decoder cannot write values there directly: an offset that is not a multiple of the dtype's size
    (no TFLite writer makes one), or a gathered entry (its values go to several places: spans.scatter)."""
    if e.representation == "gathered":
        return None
    place = out[e.offset:e.offset + e.nbytes].view(np.dtype(e.dtype).newbyteorder("<"))
    return place.reshape(e.shape) if place.flags.aligned and place.dtype == np.dtype(e.dtype) else None


class DszModel:
    """A .dsz file opened for decoding: the model's bytes, its weights and what was done to them."""

    def __init__(self, buf):
        self.version, self._model_bytes, self._rest, self.rest_codec, self.entries = _parse(buf)
        self._tflite = None

    def tflite_bytes(self) -> bytes:
        """The decoded .tflite model (cached after the first call).

        The rest of the model is inflated, and every tensor decoded, straight into the bytes object
        that is returned: no copy of the model is made on the way.
        """
        if self._tflite is None:
            self._tflite = self.filled_bytes(self._fill)
        return self._tflite

    def filled_bytes(self, fill) -> bytes:
        """A new bytes object of the model's size, written in place by fill(out) (out: a uint8 view of
        it, which fill must not keep) before anything else can see it."""
        try:
            writer = _core.BytesWriter(self._model_bytes)
        except MemoryError:
            raise DszError(f"not enough memory to decode a model of {self._model_bytes} bytes") from None
        fill(np.frombuffer(writer, dtype=np.uint8))
        return writer.take()

    def _fill(self, out: np.ndarray) -> None:
        self.inflate_rest(out)
        for e in self.entries:
            place = tensor_place(out, e)
            if place is not None:
                _decode_tensor(e, out=place)
            elif e.representation == "gathered":
                spans.scatter(out, e.spans, _decode_tensor(e), e.itemsize)
            else:
                w = _decode_tensor(e)
                out[e.offset:e.offset + e.nbytes].view(w.dtype)[:] = w.reshape(-1)

    def inflate_rest(self, out: np.ndarray) -> None:
        """Inflate the lossless rest of the model into out (uint8[model_bytes]), all but the bytes of
        the compressed tensors: the rest holds zeros there, and their decoders write every one of them.

        Those zeros (nearly all of a large model's rest) are inflated into a small buffer that stays in
        cache instead of into the model's memory, which the decoders would then write a second time.
        """
        n = self._model_bytes
        keep = kept(n, [hole for e in self.entries for hole in e.holes])
        if self.rest_codec == "lzma":
            return self._inflate_lzma(out, keep)
        chunk = np.empty(_INFLATE_CHUNK, np.uint8)
        try:
            got, k = 0, 0
            with zstandard.ZstdDecompressor().stream_reader(self._rest) as reader:
                view = memoryview(chunk)
                while got < n:
                    step = reader.readinto(view[:min(_INFLATE_CHUNK, n - got)])
                    if not step:
                        break
                    end = got + step
                    while k < len(keep) and keep[k][0] < end:
                        a, b = max(keep[k][0], got), min(keep[k][1], end)
                        out[a:b] = chunk[a - got:b - got]
                        if keep[k][1] > end:
                            break
                        k += 1
                    got = end
                view.release()
                excess = reader.read(1)
        except zstandard.ZstdError as exc:
            raise FormatError(f"the model's lossless section does not decompress: {exc}") from None
        if got != n or excess:
            raise FormatError(f"the model's lossless section holds {'more than ' if excess else ''}"
                              f"{got} bytes, the header declares {n}")

    def _inflate_lzma(self, out: np.ndarray, keep: list) -> None:
        """An LZMA2 rest: the bytes outside the holes, back to back (at most LZMA_REST_MAX), into their places."""
        n = sum(b - a for a, b in keep)
        raw = inflate_tables(self._rest, n, "the model's lossless section",
                             f"the header declares {n} outside the compressed tensors")
        at = 0
        for a, b in keep:
            out[a:b] = np.frombuffer(raw, np.uint8, b - a, at)
            at += b - a

    def weights(self) -> dict[str, np.ndarray]:
        """Decoded weight tensors by layer name, in their stored dtype (a shared buffer appears under
        each of its layers)."""
        out = {}
        for e in self.entries:
            w = _decode_tensor(e)
            if e.representation == "gathered":
                out.update(spans.named(e.name.split(","), e.spans, w))
                continue
            for name in e.name.split(","):
                out[name] = w
        return out

    def info(self) -> dict:
        """Per compressed tensor: shape, density, bound, original and compressed bytes, ratio; and totals."""
        tensors = []
        for e in self.entries:
            # original_bytes: the tensor's bytes as the model stores them (2 per float16 value)
            row = {"name": spans.label(e.name.split(",")) if e.spans else e.name, "buffer": e.buffer_index,
                   "shape": list(e.shape), "dtype": e.dtype, "representation": e.representation,
                   "error_bound": e.error_bound, "bound_unit": "steps" if e.dtype in ("int8", "uint8") else "absolute",
                   "original_bytes": e.nbytes, "compressed_bytes": len(e.stream),
                   "ratio": e.nbytes / max(len(e.stream), 1)}
            if e.representation == "sparse":
                s = codec.sparse_info(e.stream)
                row.update(density=s["nnz"] / max(e.nbytes // e.itemsize, 1), data_bytes=s["data_bytes"],
                           index_bytes=s["index_bytes"], index_codec=s["index_codec"])
            else:
                # a dense stream has no index; its density is only known by decoding it
                w = _decode_tensor(e)
                row.update(density=np.count_nonzero(w) / max(w.size, 1), data_bytes=len(e.stream),
                           index_bytes=0, index_codec=None)
            tensors.append(row)
        original = sum(t["original_bytes"] for t in tensors)
        compressed = sum(t["compressed_bytes"] for t in tensors)
        return {
            "format_version": self.version, "model_bytes": self._model_bytes,
            "rest_bytes": len(self._rest), "rest_codec": self.rest_codec, "tensors": tensors,
            "compressed_tensors": {"original_bytes": original, "compressed_bytes": compressed,
                                   "ratio": original / compressed if compressed else None},
        }

    def interpreter(self, num_threads: int | None = None):
        """A TFLite Interpreter on the decoded model (ai-edge-litert, else tflite-runtime, else TensorFlow)."""
        return make_interpreter(self.tflite_bytes(), num_threads=num_threads)


def load(path_or_bytes) -> DszModel:
    """Open a .dsz model from a path or from bytes."""
    if isinstance(path_or_bytes, (str, os.PathLike)):
        data = read_file(path_or_bytes)
        try:
            return DszModel(data)
        except FormatError as exc:  # say which file
            raise FormatError(f"{path_or_bytes}: {exc}") from None
    return DszModel(path_or_bytes)






