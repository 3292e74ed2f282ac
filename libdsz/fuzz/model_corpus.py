"""Seeds from the reference models: .dsz files as pydsz writes them, and their tensor streams.

    python3 libdsz/fuzz/model_corpus.py        (from the checkout, pydsz installed)

Packs the bundled models (pydsz/data) at bound 0.005, the small one also lossless, and two of them
pruned to 10% of their FC weights (magnitude; gives sparse streams under the index codecs the
packer picks); and lenet300's float16 and int8 versions pruned the same way (at 0.005 and 1 step).
Makes model updates of the small one (pydsz.diff_model): its weights moved a little and pruned,
against the model itself and against its .dsz as decoded.
Writes:
  corpus/dsz/        the .dsz files (tests/fuzz_load.py, tests/test_fuzz_replay.py)
  corpus/header/     every tensor stream as stored (lossless wrappers included) and unwrapped
  corpus/array/, corpus/sparse/   the streams unwrapped into raw frames, what libdsz reads
  corpus/index/      sparse index sections in fuzz_index's layout, where the matrix fits it
  corpus/dszu/       the updates (tests/fuzz_load.py applies them to pydsz/data/shared.tflite and
                     its .dsz), their difference streams in corpus/delta/
Streams over MAX_FRAME bytes are left out to keep the committed corpus small.
"""
from __future__ import annotations

import pathlib
import struct

import numpy as np

import pydsz
from pydsz import _core
from pydsz.format import wrapping
from pydsz.model.graph import TFLiteModel

HERE = pathlib.Path(__file__).resolve().parent
CORPUS = HERE / "corpus"
DATA = HERE.parent.parent / "pydsz" / "data"
MAX_FRAME = 64 << 10
BOUND = 0.005
# fuzz_index's limits (MAX_ROWS, MAX_COLS, MAX_NNZ)
INDEX_LIMITS = (32, 640, 4096)


def pruned(tflite: bytes, keep: float) -> bytes:
    """The model with all but the largest `keep` fraction of each FC weight tensor set to zero."""
    model = TFLiteModel(tflite)
    arrays = {}
    for layer in model.layers(kinds=("fc",)):
        if layer.compressible and layer.buffer not in {model.layer(n).buffer for n in arrays}:
            w = np.array(model.weight(layer), dtype=np.float32)
            cut = np.quantile(np.abs(w), 1.0 - keep)
            w[np.abs(w) < cut] = 0.0
            arrays[layer.name] = w
    return model.replace(arrays)


def raw_frame(stream: bytes) -> bytes:
    """The stream with its sections unwrapped and the header saying so."""
    u8 = np.frombuffer(stream, dtype=np.uint8)
    info = _core.frame_info(u8)
    hs, ds = info["header_size"], info["data_stored"]
    data = wrapping.inflate(info["data_lossless"], u8[hs:hs + ds], info["data_raw"], "data")
    index = wrapping.inflate(info["index_lossless"], u8[hs + ds:], info["index_raw"], "index")
    info.update(data_lossless=0, data_stored=info["data_raw"], index_lossless=0, index_stored=info["index_raw"])
    return _core.write_header(info) + data.tobytes() + index.tobytes()


def index_input(frame: bytes) -> bytes | None:
    """fuzz_index's input for a raw sparse frame: codec, rows - 1, cols - 1, nnz, index section."""
    info = _core.frame_info(np.frombuffer(frame, dtype=np.uint8))
    rows, cols = info["shape"]
    max_rows, max_cols, max_nnz = INDEX_LIMITS
    if not (1 <= rows <= max_rows and 1 <= cols <= max_cols and info["nnz"] <= max_nnz):
        return None
    index = frame[info["header_size"] + info["data_raw"]:]
    return struct.pack("<BBHH", info["index_codec"], rows - 1, cols - 1, info["nnz"]) + index


def write(folder: str, name: str, data: bytes) -> None:
    path = CORPUS / folder / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)


def updates(tflite: bytes) -> None:
    """Updates of `tflite` to it moved by 1% of each weight's scale (differences) and pruned to 30%
    (afresh), from the model and from its .dsz at BOUND; their difference streams as raw frames."""
    from pydsz.budget.rule import Budget
    from pydsz.compress.diff import diff
    from pydsz.format.update import Update

    model = TFLiteModel(tflite)
    rng = np.random.default_rng(0)
    first = {l.buffer: l for l in reversed(model.layers(kinds=("fc",))) if l.compressible}  # one per buffer
    moved = model.replace({l.name: model.weight(l) * (1 + 0.01 * rng.standard_normal(l.shape)).astype(np.float32)
                           for l in first.values()})
    x = rng.standard_normal((64, *model.input_details()[0]["shape"][1:])).astype(np.float32)
    held = pydsz.load(pydsz.pack_model(tflite, BOUND)).tflite_bytes()
    for name, base in (("shared", tflite), ("shared_e0.005", held)):
        for change, new in (("moved", moved), ("pruned30", pruned(moved, 0.3))):
            update = diff(base, new, x, None, Budget("output-error", 0.01), layers="fc").update
            write("dszu", f"{name}_{change}.dszu", update)
            for e in Update(update).entries:
                if e.kind == "delta":
                    write("delta", f"{name}_{change}_{e.name}", raw_frame(e.stream))


def main() -> None:
    variants = []
    for model in ("shared", "lenet300", "lenet5"):
        tflite = (DATA / f"{model}.tflite").read_bytes()
        variants.append((f"{model}_e0.005", pydsz.pack_model(tflite, BOUND)))
        if model != "lenet5":
            variants.append((f"{model}_pruned10_e0.005", pydsz.pack_model(pruned(tflite, 0.1), BOUND)))
        if model == "shared":
            variants.append((f"{model}_lossless", pydsz.pack_model(tflite, 0.0)))
        if model == "lenet300":  # gathered entries (container version 3): fc3 and the biases in one stream
            variants.append((f"{model}_pruned10_gathered", pydsz.pack_model(
                pruned(tflite, 0.1), BOUND, gather_small=True, constants_rel=2.0 ** -10)))
    # the float16 and int8 reference models (stored dtypes, container version 2), pruned to stay small
    for model, bound in (("lenet300_f16", BOUND), ("lenet300_int8", "1q")):
        tflite = pruned((DATA / f"{model}.tflite").read_bytes(), 0.1)
        variants.append((f"{model}_pruned10_{bound if isinstance(bound, str) else f'e{bound}'}",
                         pydsz.pack_model(tflite, bound)))
    for name, dsz in variants:
        if len(dsz) <= 4 * MAX_FRAME:
            write("dsz", f"{name}.dsz", dsz)
        for e in pydsz.load(dsz).entries:
            if len(e.stream) > MAX_FRAME:
                continue
            tensor = e.name.replace(",", "+")
            frame = raw_frame(e.stream)
            kind = "sparse" if e.representation == "sparse" else "array"
            write("header", f"{name}_{tensor}_stored", e.stream)
            if len(frame) <= MAX_FRAME:
                write(kind, f"{name}_{tensor}", frame)
                write("header", f"{name}_{tensor}", frame)
                seed = index_input(frame) if kind == "sparse" else None
                if seed is not None:
                    write("index", f"{name}_{tensor}", seed)
    updates((DATA / "shared.tflite").read_bytes())
    for folder in sorted(p for p in CORPUS.iterdir() if p.is_dir()):
        files = list(folder.iterdir())
        print(f"{folder.name}: {len(files)} files, {sum(f.stat().st_size for f in files)} bytes")


if __name__ == "__main__":
    main()
