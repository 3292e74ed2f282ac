"""atheris fuzz target: pydsz's readers on arbitrary bytes.

A .dsz model goes through pydsz.load() and everything a loaded model decodes (tflite_bytes,
weights, info); an array or sparse stream through decompress_array / decode_sparse /
decode_sparse_csr / sparse_info; a model update (.dszu) through pydsz.patch onto the two bases the
corpus's updates were made for (pydsz/data/shared.tflite and its .dsz in the corpus).
Only pydsz.DszError and its subclasses may escape; any other exception, a hang (-timeout) or a
memory blow-up (-rss_limit_mb) is a finding. Mutations of a .dsz or .dszu file are also tried
with both CRC-32s made right again, so that they reach the table and the streams instead of stopping at
the checksum.

    pip install atheris
    python tests/fuzz_load.py -max_total_time=60 -max_len=8192 libdsz/fuzz/corpus/dsz

-max_len bounds what a zstd-wrapped section may legitimately inflate to (up to 32768 times its
size), which -rss_limit_mb (default 2048) would otherwise report as a finding.

Not collected by pytest (no test_ prefix); tests/test_fuzz_replay.py replays the committed
corpus through exercise() without atheris.
"""
from __future__ import annotations

import functools
import pathlib
import struct
import sys
import zlib

_CRC = struct.Struct("<I")
# per magic: the header's size and where in it the table's size is
_LAYOUT = {b"DSZM": (40, 12), b"DSZU": (104, 84)}
_CORPUS = pathlib.Path(__file__).resolve().parent.parent / "libdsz" / "fuzz" / "corpus"


def with_fixed_crcs(data: bytes) -> bytes | None:
    """The .dsz or .dszu bytes with the header CRC and the whole-file CRC recomputed (None if too
    short)."""
    header_bytes, table_at = _LAYOUT[data[:4]]
    if len(data) < header_bytes:
        return None
    (table_bytes,) = _CRC.unpack_from(data, table_at)
    head_end = header_bytes + table_bytes
    if head_end + 2 * _CRC.size > len(data):
        return None
    fixed = bytearray(data)
    _CRC.pack_into(fixed, head_end, zlib.crc32(fixed[:head_end]) & 0xFFFFFFFF)
    _CRC.pack_into(fixed, len(fixed) - 4, zlib.crc32(fixed[:-4]) & 0xFFFFFFFF)
    return bytes(fixed)


def _load(data: bytes) -> None:
    import pydsz

    model = pydsz.load(data)
    model.tflite_bytes()
    model.weights()
    model.info()


@functools.lru_cache(maxsize=None)
def _bases() -> tuple:
    """The models the corpus's updates were made for, as a device holds them."""
    from pydsz.format.update import held_model
    from pydsz.model.data import data_dir

    return held_model(data_dir() / "shared.tflite"), held_model(_CORPUS / "dsz" / "shared_e0.005.dsz")


def _patch(data: bytes) -> None:
    from pydsz.format.update import Update

    update = Update(data)
    base = next((b for b in _bases() if len(b) and update.base_sha256 == _sha256(b)), _bases()[0])
    update.apply(base)


def _sha256(data: bytes) -> bytes:
    import hashlib

    return hashlib.sha256(data).digest()


# A valid stream of n rows decodes to n + 1 row pointers of 8 bytes, however few its non-zeros: a
# 288-byte stream declaring 654M rows asks for 5 GB (their output, as the dense decode's would be
# 65 GB, which calloc never touches). Streams declaring more rows than this skip the CSR decode,
# as -max_len caps what a section may inflate to.
CSR_MAX_ROWS = 1 << 22


def _csr_rows(data: bytes) -> int:
    """The rows a sparse stream's header declares (0 where it cannot be read)."""
    import pydsz

    try:
        return pydsz.sparse_info(data)["rows"]
    except pydsz.DszError:
        return 0


def exercise(data: bytes) -> None:
    """Run every reader that applies to `data`; raises only DszError (anything else is a bug)."""
    import pydsz

    magic = data[:4]
    try:
        if magic == b"DSZA":
            pydsz.decompress_array(data)
        elif magic == b"DSZS":
            pydsz.sparse_info(data)
            pydsz.decode_sparse(data)
        elif magic == b"DSZU":
            _patch(data)
        else:
            _load(data)
    except pydsz.DszError:
        pass
    if magic == b"DSZS" and _csr_rows(data) <= CSR_MAX_ROWS:
        try:  # also where the dense decode failed: a matrix too large for memory is no CSR's concern
            pydsz.format.codec.decode_sparse_csr(data)
        except pydsz.DszError:
            pass
    if magic in _LAYOUT:
        fixed = with_fixed_crcs(data)
        if fixed is not None and fixed != data:
            try:
                _patch(fixed) if magic == b"DSZU" else _load(fixed)
            except pydsz.DszError:
                pass


def main() -> None:
    import atheris

    with atheris.instrument_imports(include=["pydsz"]):
        import pydsz  # noqa: F401  (instrumented for coverage)

    atheris.Setup(sys.argv, lambda data: exercise(bytes(data)))
    atheris.Fuzz()


if __name__ == "__main__":
    main()
