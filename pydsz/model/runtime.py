"""Running a model over a data set in batches, and reading intermediate tensors, on an interpreter
of pydsz.format.interpreter."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Mapping, Optional

import numpy as np

from pydsz.errors import DszError, InputError
from pydsz.format.interpreter import interpreter_class, make_interpreter

__all__ = ["predict", "outputs", "fit_inputs", "accuracy", "probe", "batch_size"]


DEFAULT_BATCH = 256
# capture() preserves every tensor of a batch: its batches hold at most this many bytes of them
# (VGG-16's trunk keeps 0.85 MiB a sample, 217 MiB for a batch of 256)
CAPTURE_BYTES = 64 << 20
# outputs() sizes its batches so that their non-constant tensors take at most this many bytes: the
# interpreter's arena grows with the batch (the AlexNet-shaped model, 496 KiB a sample: +86 MiB at
# 256 samples, +17 MiB at 64, which run within 6% of the time); small models keep DEFAULT_BATCH
BATCH_BYTES = 32 << 20
# The most samples the probe runs together and alone to find outputs that depend on the batch (_spread)
PROBE_SAMPLES = 8










def real(details: list, arrays: list) -> list:
    """The interpreter's output arrays as the values they stand for: an integer tensor with a quantization
    scale as scale * (q - zero point) in float32, per tensor or along its quantized axis; the others as
    they are. A fully integer classifier hands out its probabilities as int8 with zero point -128: read as
    they are, probability 0 is -128, so output-error sees norms of hundreds (a change read 2-3x smaller
    than it is) and expected-top1 takes the integers for logits."""
    out = []
    for d, a in zip(details, arrays):
        q = d.get("quantization_parameters") or {}
        scales = np.asarray(q.get("scales", ()), np.float32)
        if a.dtype.kind in "iu" and scales.size and np.all(scales > 0):
            zeros = np.asarray(q.get("zero_points", ()), np.int64)
            zeros = zeros if zeros.size == scales.size else np.zeros(scales.size, np.int64)
            if scales.size > 1:
                shape = [1] * a.ndim
                shape[q.get("quantized_dimension", 0)] = -1
                scales, zeros = scales.reshape(shape), zeros.reshape(shape)
            a = (a.astype(np.int64) - zeros).astype(np.float32) * scales
        out.append(a)
    return out


def _interpreter(model, num_threads):
    return model if hasattr(model, "invoke") else make_interpreter(model, num_threads=num_threads)


_LIBC = None


def _libc():
    """glibc, or False where there is none (musl and others have no malloc_trim)."""
    global _LIBC
    if _LIBC is None:
        try:
            import ctypes

            _LIBC = ctypes.CDLL("libc.so.6")
            _LIBC.malloc_trim  # noqa: B018
        except (OSError, AttributeError):
            _LIBC = False
    return _LIBC


def trim() -> None:
    """Hand the heap's free memory back to the system (glibc's malloc_trim). glibc keeps a freed
    interpreter's tensors (a batch's: tens of MiB) and the next interpreter's come on top; the
    candidates' interpreters follow one another, so without this the process grows by one batch's
    tensors beyond what pydsz.compress.footprint counts."""
    if libc := _libc():
        libc.malloc_trim(0)


# Blocks from this size on are mapped apart (M_MMAP_THRESHOLD), and so given back when freed.
MMAP_THRESHOLD = 8 << 20
_M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter


def pin_mmap_threshold() -> None:
    """Map every block of MMAP_THRESHOLD bytes or more apart for the rest of the process. glibc raises
    its threshold to the largest mapped block freed so far (up to 32 MiB), after which arrays of that
    size come from the heap, and a freed one below a live block stays resident: the same command's peak
    then moves with the order of its allocations (birdnet_meta's compress: 540 to 577 MiB against a
    bound of 572, from changes that allocate nothing large). Pinned at 8 MiB it peaks at 520 MiB, as
    fast (55.6 s against 54.1; at 128 KiB 498 MiB, but 1.3-1.6x as long)."""
    if libc := _libc():
        libc.mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)


def fit_inputs(details, x, source: str = "x", finite: bool = True) -> list:
    """x (one array, or several: a list in the model's input order, or a dict keyed x0, x1, ... or by
    the inputs' names: "key" of TFLiteModel.input_details where the details have it, else the
    tensor names) as one array per model input, each reshaped to the input's sample shape.

    InputError, naming `source`, where the arrays do not fit the inputs: count, sample shape,
    values that the input's integer type cannot hold, or (finite=True) a NaN or an infinity, naming
    the array and the first sample that holds one.
    """
    names = [d.get("key", d["name"]) for d in details]
    if isinstance(x, Mapping):
        by_position = [f"x{i}" for i in range(len(details))]
        if set(x) == set(by_position):
            arrays = [x[k] for k in by_position]
        elif set(x) == set(names):
            arrays = [x[k] for k in names]
        else:
            raise InputError(f"{source}: arrays {', '.join(sorted(x))} do not match the model's inputs: give "
                             f"{', '.join(by_position)} or the inputs' names ({', '.join(names)})")
    else:
        arrays = list(x) if isinstance(x, (list, tuple)) else [x]
        if len(arrays) != len(details):
            raise InputError(f"{source}: {len(arrays)} input array(s) for a model with {len(details)} inputs "
                             f"({', '.join(names)}): give x0, x1, ... or the inputs' names")
    fitted = []
    labels = (names if isinstance(x, Mapping) and set(x) != {f"x{i}" for i in range(len(details))}
              else ["x"] if len(details) == 1 else [f"x{i}" for i in range(len(details))])
    for name, label, detail, a in zip(names, labels, details, arrays):
        what = source if len(details) == 1 else f"{source}: input {name}"
        a = np.asarray(a)
        sample_shape = tuple(int(d) for d in detail["shape"][1:])
        if a.ndim < 1 or a.shape[0] == 0:
            raise InputError(f"{what} needs at least one sample along the first axis, got shape {a.shape}")
        if a.dtype.kind not in "biuf":
            raise InputError(f"{what} must be numeric, got {a.dtype}")
        signature = tuple(detail.get("shape_signature", ()))[1:]
        if len(signature) == len(sample_shape) == a.ndim - 1 and any(d == -1 for d in signature) and all(
                d in (-1, have) for d, have in zip(signature, a.shape[1:])):
            sample_shape = tuple(a.shape[1:])  # a dynamic shape (a tensor fed across a cut): the array's own
        have, need = int(np.prod(a.shape[1:], dtype=np.int64)), int(np.prod(sample_shape, dtype=np.int64))
        if have != need:
            raise InputError(f"{what} has samples of shape {a.shape[1:]} ({have} values) "
                             f"but the model takes {sample_shape}")
        dtype = np.dtype(detail["dtype"])
        if dtype.kind in "iu" and a.size:
            info = np.iinfo(dtype)
            if a.dtype.kind == "f" and not np.all(np.mod(a, 1) == 0):
                raise InputError(f"{what} goes to a {dtype} input but holds fractions ({a.dtype})")
            if a.min() < info.min or a.max() > info.max:
                raise InputError(f"{what} goes to a {dtype} input ({info.min}..{info.max}) but "
                                 f"spans {a.min()}..{a.max()}")
        if finite and a.dtype.kind == "f":
            _check_finite(a, source, label)
        fitted.append(a.reshape((a.shape[0],) + sample_shape))
    if len({len(a) for a in fitted}) > 1:
        raise InputError(f"{source}: the input arrays hold different numbers of samples "
                         f"({', '.join(str(len(a)) for a in fitted)})")
    return fitted


def _check_finite(a: np.ndarray, source: str, label: str) -> None:
    """InputError naming the array and the first sample of `a` that holds a NaN or an infinity."""
    bad = ~np.isfinite(a.reshape(len(a), -1)).all(axis=1)
    if bad.any():
        first = int(np.argmax(bad))
        what = "NaN" if np.isnan(a[first]).any() else "an infinity"
        others = int(bad.sum()) - 1
        raise InputError(f"{source}: array '{label}', sample {first} holds {what}"
                         + (f" ({others} other sample{'s' if others > 1 else ''} too)" if others else "")
                         + ": give finite inputs")


def run_batches(interpreter, x, batch_size: int, read) -> list:
    """Feed x (see fit_inputs) to the inputs in batches; collect read(interpreter), a list of arrays
    with one row per sample of the batch (or none, where read keeps the values itself), for each
    batch in order.

    A model whose inputs declare a fixed batch (shape_signature without -1) runs one sample at a
    time; so does one whose graph turns out to hard-code a batch of 1 (an invoke that fails, or an
    output that does not hold a row per sample, e.g. behind a RESHAPE to [1, n]).
    """
    details = interpreter.get_input_details()
    arrays = fit_inputs(details, x, finite=False)
    if batch_size < 1:
        raise InputError(f"batch_size must be >= 1, got {batch_size}")
    if any(len(d.get("shape_signature", ())) and d["shape_signature"][0] != -1 for d in details):
        batch_size = 1
    n = arrays[0].shape[0]
    results = []
    rows = None  # the batch size the interpreter is allocated for (None: not yet allocated here)
    start = 0
    while start < n:
        batches = [np.ascontiguousarray(a[start:start + batch_size], dtype=d["dtype"]) for a, d in zip(arrays, details)]
        size = batches[0].shape[0]
        try:
            if size != rows:
                for d, batch in zip(details, batches):
                    interpreter.resize_tensor_input(d["index"], list(batch.shape))
                interpreter.allocate_tensors()
                rows = size
            for d, batch in zip(details, batches):
                interpreter.set_tensor(d["index"], batch)
            interpreter.invoke()
            values = read(interpreter)
            if any(v.ndim == 0 or v.shape[0] != size for v in values):
                raise ValueError("an output does not hold one row per sample of the batch")
        except InputError:
            raise
        except (RuntimeError, ValueError) as exc:
            if batch_size == 1:
                raise DszError(f"the TFLite interpreter failed on sample {start}: {exc}") from exc
            batch_size, rows = 1, None
            continue
        results.append(values)
        start += size
    return results


def batch_within(model, budget: int, x=None) -> int:
    """As many samples (up to DEFAULT_BATCH) as keep a batch's non-constant tensors within `budget`
    bytes: their sizes as one sample of x makes them (probe), else as the model declares them (a
    dynamic shape then counts 1 along its free axes: BirdNET's declare 5 MB a sample and take 112).
    One sample at a time where the model's outputs depend on the batch (Probe.batch_dependence): a
    sample is then measured as a user who runs it alone gets it. Otherwise a sample's values do not
    depend on the batch beyond float rounding (some runtimes' kernels round differently by batch):
    a comparison runs both sides with the same rule."""
    if x is None:
        return max(1, min(DEFAULT_BATCH, budget // max(1, _declared_bytes(model))))
    found = probe(model, x)
    if found.batch_dependence > BATCH_TOLERANCE:
        return 1
    return max(1, min(DEFAULT_BATCH, budget // max(1, found.sample_bytes)))


def _declared_bytes(model) -> int:
    from pydsz.model.graph import TFLiteModel

    parsed = model if isinstance(model, TFLiteModel) else TFLiteModel(bytes(model))
    return sum(int(np.prod(t.shape[1:])) * (np.dtype(t.dtype).itemsize if t.dtype else 4)
               for t in parsed.tensors if len(t.shape) and parsed.constant(t.index) is None)


# Outputs of a sample run alone and in a batch that differ by more than this (relative L2) make a model
# batch dependent; the builtin kernels differ between batch sizes by float rounding only (1e-7).
BATCH_TOLERANCE = 1e-4


@dataclass(frozen=True)
class Probe:
    """What running one sample and several says about a model's tensors: the bytes one sample's
    non-constant tensors take (all of them at once: what the batch is sized by), which tensors
    hold one row per sample (None where the model does not run several samples at once), and how far a
    sample's outputs in a batch are from its outputs alone (openWakeWord's mel front end clamps by the
    batch's loudest sample: 2% apart at two samples, 7% at 32)."""

    sample_bytes: int
    rows: Optional[frozenset]
    tensors: Optional[dict] = None  # tensor index -> its bytes for one sample (None: declared shapes only)
    batch_dependence: float = 0.0  # the largest relative L2 difference of an output, batched against alone
    temporary: int = 0  # the largest kernel temporary of one sample (a convolution's im2col buffer)

    @property
    def working_bytes(self) -> int:
        """What the interpreter works in for one sample: its tensors and, on top, the largest
        temporary (basic-pitch: 25 + 162 MiB, where the tensors alone said 25)."""
        return self.sample_bytes + self.temporary


def probe(model, x, samples: int = PROBE_SAMPLES) -> Probe:
    """Run one sample of x (and, samples > 1, up to that many together, then each of the others alone) on
    the builtin kernels and read the tensors' shapes (invoke computes those only known at run time). The
    samples span x's inputs in scale (_spread); the batch holds as many as keep it within BATCH_BYTES, at
    least two. Kernel temporaries are not kept: keeping every tensor (experimental_preserve_all_tensors)
    held basic-pitch's im2col buffers, 1.35 GB, for shapes that invoke gives anyway. A model the probe
    cannot run is described by its declared shapes (rows None)."""
    from pydsz.model.graph import TFLiteModel

    parsed = model if isinstance(model, TFLiteModel) else TFLiteModel(bytes(model))
    cls = interpreter_class()
    resolver = sys.modules[cls.__module__].OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES
    shapes, it, outs, temporary, k = [], None, [], 0, 1
    try:
        it = cls(model_content=parsed.data, experimental_op_resolver_type=resolver)
        details = it.get_input_details()
        arrays = fit_inputs(details, x, finite=False)
        arrays = [a[_spread(arrays, samples)] for a in arrays]

        def run(take: slice) -> list:
            for d, a in zip(details, arrays):
                it.resize_tensor_input(d["index"], [take.stop - take.start, *a.shape[1:]])
            it.allocate_tensors()
            for d, a in zip(details, arrays):
                it.set_tensor(d["index"], np.ascontiguousarray(a[take], dtype=d["dtype"]))
            it.invoke()
            out = it.get_output_details()
            outs.append(real(out, [it.get_tensor(d["index"]).copy() for d in out]))
            tensors = it.get_tensor_details()
            if len(shapes) < 2:  # one sample's, then the batch's
                shapes.append({d["index"]: (tuple(int(v) for v in d["shape"]), np.dtype(d["dtype"]).itemsize)
                               for d in tensors if d["index"] < len(parsed.tensors)})
            return tensors

        # sample 0 alone, then k together, then samples 1..k-1 alone: each sample batched and alone
        temporary = max((int(np.prod(d["shape"])) * np.dtype(d["dtype"]).itemsize for d in run(slice(0, 1))
                         if d["index"] >= len(parsed.tensors)), default=0)
        working = temporary + sum(int(np.prod(shape)) * size for t, (shape, size) in shapes[0].items()
                                  if parsed.constant(t) is None)
        k = min(len(arrays[0]), samples, max(2, BATCH_BYTES // max(working, 1)))
        if k > 1:
            run(slice(0, k))
            for i in range(1, k):
                run(slice(i, i + 1))
    except (RuntimeError, ValueError):
        pass
    it = None
    trim()
    if not shapes:
        return Probe(_declared_bytes(parsed), None)
    one = shapes[0]
    sizes = {t: int(np.prod(shape)) * size for t, (shape, size) in one.items() if parsed.constant(t) is None}
    per_sample = sum(sizes.values())
    rows = None
    if len(shapes) > 1:
        rows = frozenset(t for t, (shape, _) in shapes[1].items() if len(shape) >= 1 and shape[0] == k
                         and len(one.get(t, ((),))[0]) >= 1 and one[t][0][0] == 1)
    return Probe(per_sample, rows, sizes, _batch_dependence(outs), temporary)


def _spread(arrays: list, k: int, chunk: int = 64) -> list:
    """The indices of k samples spanning the inputs' scale (sum of squares over every input): the largest,
    the smallest, and ranks evenly between, in that order (a batch's first k of them are spread too).
    openWakeWord's mel front end clamps by the batch's loudest sample, which moves a window only where
    part of it lies 80 dB below that sample: of 256 recorded windows, the first two moved each other
    by less than BATCH_TOLERANCE, and so did the loudest and the quietest, whose quiet is even; paired
    with the loudest, 41% of them move, by up to 146%. A probe of two then ran the model in batches
    and measured a fourteenth of the drift each window alone shows."""
    n = len(arrays[0])
    if n < 2 or any(len(a) != n for a in arrays):
        return list(range(min(n, k)))
    energy = np.zeros(n)
    for a in arrays:
        flat = a.reshape(n, -1)
        for i in range(0, n, chunk):  # float64 a chunk at a time: no copy of the whole data
            energy[i:i + chunk] += np.sum(np.square(flat[i:i + chunk], dtype=np.float64), axis=1)
    order = np.argsort(-energy, kind="stable")
    ranks = np.unique(np.round(np.linspace(0, n - 1, min(k, n))).astype(int))
    picked = [int(order[0]), int(order[-1])] + [int(order[r]) for r in ranks[1:-1]]
    return picked[:k]


def _batch_dependence(outs: list) -> float:
    """The largest relative L2 difference between an output of a sample alone and in the batch (outs:
    sample 0 alone, the k samples together, samples 1..k-1 alone); 0 where the model ran no batch, or
    where a run failed (the batch's rows are then not one per run alone)."""
    if len(outs) < 3:
        return 0.0
    k = len(outs) - 1
    worst = 0.0
    for alone, row in zip([outs[0], *outs[2:]], range(k)):
        for a, b in zip(alone, outs[1]):
            if b.ndim == 0 or b.shape[0] != k or a.shape[1:] != b.shape[1:]:
                return 0.0  # not one row per sample: the runtime's batching check says so apart
            a, b = a[0].astype(np.float64), b[row].astype(np.float64)
            worst = max(worst, float(np.linalg.norm(a - b) / max(np.linalg.norm(a), 1e-30)))
    return worst


def batch_size(model, x=None) -> int:
    """The batch outputs() runs a model (bytes or TFLiteModel) in: as many samples as keep its
    non-constant tensors within BATCH_BYTES (their sizes on x's first sample, where x is given)."""
    return batch_within(model, BATCH_BYTES, x)


def outputs(model, x, keys, batch_size: Optional[int] = None, num_threads: Optional[int] = None) -> dict:
    """Every output of the model for every sample of x, as {key: array [n, ...]}: keys name the
    outputs in order (TFLiteModel.output_details()'s "key"), quantized ones as the values they stand
    for (real). batch_size: by default as many samples as keep the batch's tensors within BATCH_BYTES
    (an interpreter given: DEFAULT_BATCH)."""
    if batch_size is None:
        batch_size = DEFAULT_BATCH if hasattr(model, "invoke") else batch_within(model, BATCH_BYTES, x)
    interpreter = _interpreter(model, num_threads)
    details = interpreter.get_output_details()
    if len(keys) != len(details):
        raise InputError(f"{len(keys)} output names for a model of {len(details)} outputs")
    parts = run_batches(interpreter, x, batch_size, lambda it: real(details, [it.get_tensor(d["index"]).copy() for d in details]))
    if interpreter is not model:
        del interpreter
        trim()
    return {key: np.concatenate([p[i] for p in parts], axis=0) for i, key in enumerate(keys)}


def predict(model, x, batch_size: int = DEFAULT_BATCH, num_threads: Optional[int] = None,
            output: int = 0) -> np.ndarray:
    """The model's output (number `output`) for every sample of x, stacked along the first axis.

    model: bytes, TFLiteModel or an interpreter. Each sample of x is reshaped to the input's
    shape when the value counts match and cast to the input's dtype as is (no quantization); a
    quantized output comes as the values it stands for (real).
    """
    interpreter = _interpreter(model, num_threads)
    outputs = interpreter.get_output_details()
    if not 0 <= output < len(outputs):
        raise InputError(f"output {output} out of range: the model has {len(outputs)} output(s)")
    index = outputs[output]["index"]
    parts = run_batches(interpreter, x, batch_size, lambda it: real(outputs[output:output + 1], [it.get_tensor(index).copy()]))
    return np.concatenate([p[0] for p in parts], axis=0)


def top1(scores: np.ndarray, y) -> float:
    """Fraction of rows of scores whose largest entry is at the label y; checks the labels."""
    y = np.asarray(y)
    scores = scores.reshape(scores.shape[0], -1)
    if y.ndim != 1 or y.shape[0] != scores.shape[0]:
        raise InputError(f"y must be a vector of {scores.shape[0]} labels, got shape {y.shape}")
    if not np.issubdtype(y.dtype, np.integer):
        raise InputError(f"labels must be integers, got {y.dtype}")
    classes = scores.shape[1]
    if y.size and (y.min() < 0 or y.max() >= classes):
        raise InputError(f"labels range over {int(y.min())}..{int(y.max())} but the model has {classes} outputs")
    return float(np.mean(np.argmax(scores, axis=1) == y))


def accuracy(model, x, y, batch_size: int = DEFAULT_BATCH, num_threads: Optional[int] = None) -> float:
    """Top-1 accuracy of the model's first output on (x, y)."""
    y = np.asarray(y)
    if y.ndim != 1 or y.shape[0] != np.shape(x)[0]:
        raise InputError(f"y must be a vector of {np.shape(x)[0]} labels (one per sample of x), got shape {y.shape}")
    return top1(predict(model, x, batch_size=batch_size, num_threads=num_threads), y)










