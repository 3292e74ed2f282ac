"""Decoding a .dsz model with a clock on each stage, as DeepSZ's decoding-time figure splits it.

DeepSZ times lossless decompression, SZ decompression of the values and sparse reconstruction
one after the other. libdsz fuses the last two into one pass (index symbols, value codes and the
scatter into the dense matrix are decoded together), so `values` is measured by a separate pass
that decodes each data section alone, and `reconstruction` is the fused pass minus it. The bytes
come from the same calls DszModel.tflite_bytes() makes (tests/test_edge.py checks they are equal).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from pydsz import _core
from pydsz.errors import FormatError
from pydsz.format import codec, spans, wrapping
from pydsz.format.container import DszModel, tensor_place


@dataclass
class Stages:
    """Seconds spent in each decoding stage, summed over the model's tensors."""

    lossless: float = 0.0        # the zstd or lzma rest of the model and each section's lossless wrapper
    values: float = 0.0          # the quantized values alone (a separate, measuring pass)
    reconstruction: float = 0.0  # zeroing, index decoding and scatter: the fused pass minus `values`
    per_tensor: dict = field(default_factory=dict)

    @property
    def total(self) -> float:
        """What decoding costs without the measuring pass."""
        return self.lossless + self.values + self.reconstruction


def _values_alone(info: dict) -> dict:
    """A sparse stream's data section read as an array stream: it codes the nnz values exactly as an
    array stream of nnz values does, so the array decoder can decode the values on their own."""
    nnz = info["nnz"]
    return dict(info, kind=_core.KIND_ARRAY, ndim=1, shape=(nnz,), n_elements=nnz, index_codec=0,
                index_lossless=0, index_raw=0, index_stored=0)


def _decode_timed(e, place: np.ndarray, stages: Stages) -> None:
    """Decode tensor e into place (its stored dtype, e.shape), adding each stage's time to stages."""
    sparse = e.representation == "sparse"
    what = f"tensor {e.name}"
    t0 = time.perf_counter()
    info, u8 = codec._open_frame(e.stream, _core.KIND_SPARSE if sparse else _core.KIND_ARRAY, what)
    hs, ds = info["header_size"], info["data_stored"]
    data = wrapping.inflate(info["data_lossless"], u8[hs:hs + ds], info["data_raw"], what)
    index = wrapping.inflate(info["index_lossless"], u8[hs + ds:], info["index_raw"], what) if sparse else None
    t1 = time.perf_counter()
    if info["n_elements"] != place.size:
        raise FormatError(f"{what}: the stream decodes to {info['n_elements']} values, the table says {e.shape}")
    flat = place.reshape(-1)
    # written once before the clock starts, so that the measuring pass pays no page faults the
    # fused pass (writing into the already inflated model) does not pay either
    scratch = np.zeros(info["nnz"], flat.dtype) if sparse else None
    try:
        t2 = time.perf_counter()
        if sparse:
            codec.decode_array_section(_values_alone(info), data, scratch)
            t3 = time.perf_counter()
            flat.fill(0)
            codec.decode_sparse_sections(info, data, index, flat)
        else:
            codec.decode_array_section(info, data, flat)
            t3 = time.perf_counter()
        t4 = time.perf_counter()
    except _core.CoreError as exc:
        raise FormatError(f"{what}: {exc.name}") from None
    # a dense stream has nothing to reconstruct: its one pass is value decoding
    times = {"lossless": t1 - t0, "values": t3 - t2, "reconstruction": max(t4 - t3 - (t3 - t2), 0.0)}
    stages.lossless += times["lossless"]
    stages.values += times["values"]
    stages.reconstruction += times["reconstruction"]
    stages.per_tensor[e.name] = times


def _fill_timed(model: DszModel, out: np.ndarray, stages: Stages) -> None:
    t0 = time.perf_counter()
    model.inflate_rest(out)
    stages.lossless += time.perf_counter() - t0
    for e in model.entries:
        if e.representation == "gathered":  # decoded into scratch, then written to each span's place
            values = np.empty(e.shape, np.dtype(e.dtype))
            _decode_timed(e, values, stages)
            t0 = time.perf_counter()
            spans.scatter(out, e.spans, values, e.itemsize)
            stages.reconstruction += time.perf_counter() - t0
            continue
        place = tensor_place(out, e)
        if place is None:
            raise FormatError(f"tensor {e.name}: offset {e.offset} is not a multiple of {e.itemsize}; "
                              "decode it with DszModel.tflite_bytes()")
        _decode_timed(e, place, stages)


def decode_timed(model: DszModel) -> tuple[bytes, Stages]:
    """The decoded .tflite bytes of model, written in place as tflite_bytes() does, and the stage times."""
    stages = Stages()
    return model.filled_bytes(lambda out: _fill_timed(model, out, stages)), stages
