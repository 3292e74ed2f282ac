"""Canonical Huffman coding of small alphabets in numpy: how Deep Compression codes its indices.

Stream: alphabet size (u16), one code length per symbol (u8, 0 = unused: the table Deep
Compression must store too), the number of symbols (u32) and of payload bytes (u32), then the
codes MSB first, padded to a whole byte.
"""

from __future__ import annotations

import heapq
import struct

import numpy as np

from pydsz.errors import FormatError

# Codes are limited in length so that the decoder's lookup table stays small (2**16 entries).
MAX_BITS = 16
_ALPHABET = struct.Struct("<H")
_COUNTS = struct.Struct("<II")


def _lengths(counts: np.ndarray) -> np.ndarray:
    lengths = np.zeros(len(counts), np.int64)
    heap = [(int(c), s, [s]) for s, c in enumerate(counts) if c > 0]
    if len(heap) == 1:
        lengths[heap[0][1]] = 1
    heapq.heapify(heap)
    while len(heap) > 1:
        c1, t1, s1 = heapq.heappop(heap)
        c2, t2, s2 = heapq.heappop(heap)
        lengths[s1 + s2] += 1
        heapq.heappush(heap, (c1 + c2, min(t1, t2), s1 + s2))
    return lengths


def code_lengths(counts) -> np.ndarray:
    """Huffman code lengths for symbol counts, none over MAX_BITS (0 for symbols never used)."""
    counts = np.asarray(counts, np.int64)
    while True:
        lengths = _lengths(counts)
        if lengths.max(initial=0) <= MAX_BITS:
            return lengths
        # flatten the distribution (same symbols in use) until the longest code fits
        counts = np.where(counts > 0, (counts + 1) // 2, 0)


def _canonical(lengths: np.ndarray) -> np.ndarray:
    codes = np.zeros(len(lengths), np.int64)
    code, previous = 0, 0
    for s in sorted(np.flatnonzero(lengths), key=lambda s: (lengths[s], s)):
        code <<= int(lengths[s]) - previous
        codes[s], previous = code, int(lengths[s])
        code += 1
    return codes


def encode(symbols: np.ndarray, alphabet: int) -> bytes:
    """Symbols in range(alphabet), Huffman-coded with their own table in front."""
    symbols = np.asarray(symbols, np.int64)
    lengths = code_lengths(np.bincount(symbols, minlength=alphabet))
    codes = _canonical(lengths)
    sym_len, sym_code = lengths[symbols], codes[symbols]
    owner = np.repeat(np.arange(symbols.size), sym_len)
    within = np.arange(owner.size) - np.repeat(np.cumsum(sym_len) - sym_len, sym_len)
    bits = (sym_code[owner] >> (sym_len[owner] - 1 - within)) & 1
    payload = np.packbits(bits.astype(np.uint8)).tobytes()
    return (_ALPHABET.pack(alphabet) + lengths.astype(np.uint8).tobytes()
            + _COUNTS.pack(symbols.size, len(payload)) + payload)


def decode(buf: bytes, pos: int = 0) -> tuple[np.ndarray, int]:
    """(symbols, position after the stream) of an `encode` stream starting at buf[pos]."""
    what = "Huffman stream"
    if len(buf) < pos + _ALPHABET.size:
        raise FormatError(f"{what}: truncated")
    (alphabet,) = _ALPHABET.unpack_from(buf, pos)
    pos += _ALPHABET.size
    if len(buf) < pos + alphabet + _COUNTS.size:
        raise FormatError(f"{what}: truncated table")
    lengths = np.frombuffer(buf, np.uint8, alphabet, pos).astype(np.int64)
    n, nbytes = _COUNTS.unpack_from(buf, pos + alphabet)
    pos += alphabet + _COUNTS.size
    if len(buf) < pos + nbytes:
        raise FormatError(f"{what}: truncated payload")
    if n == 0:
        return np.zeros(0, np.int64), pos + nbytes
    width = int(lengths.max())
    if not 1 <= width <= MAX_BITS or np.sum(2.0 ** -lengths[lengths > 0]) > 1:
        raise FormatError(f"{what}: invalid code lengths")
    table_sym = np.zeros(1 << width, np.int64)
    table_len = np.zeros(1 << width, np.int64)  # 0: no code starts with these bits
    for s, code in enumerate(_canonical(lengths)):
        if lengths[s]:
            lo = int(code) << (width - int(lengths[s]))
            hi = (int(code) + 1) << (width - int(lengths[s]))
            table_sym[lo:hi], table_len[lo:hi] = s, lengths[s]
    bits = np.concatenate([np.unpackbits(np.frombuffer(buf, np.uint8, nbytes, pos)).astype(np.int64),
                           np.zeros(width, np.int64)])
    nbits = bits.size - width
    # the next `width` bits at every bit position, so that one table lookup decodes one symbol
    windows = np.zeros(nbits, np.int64)
    for j in range(width):
        windows = (windows << 1) | bits[j:j + nbits]
    win, tsym, tlen = windows.tolist(), table_sym.tolist(), table_len.tolist()
    out, at = [0] * n, 0
    for i in range(n):
        if at >= nbits or not tlen[win[at]]:
            raise FormatError(f"{what}: bits do not decode to {n} symbols")
        out[i] = tsym[win[at]]
        at += tlen[win[at]]
    if at > nbits:
        raise FormatError(f"{what}: bits do not decode to {n} symbols")
    return np.array(out, np.int64), pos + nbytes
