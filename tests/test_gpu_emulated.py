"""The GPU kernels without a GPU: tests/cuda_emu runs CUDA C on the CPU and stands in for pycuda,
so the gpu-marked tests of test_gpu.py run everywhere; and tests of the emulator itself."""

import importlib.util
import os
import re
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parent.parent
EMU = ROOT / "tests" / "cuda_emu"

pytestmark = pytest.mark.skipif(shutil.which(os.environ.get("CXX", "g++")) is None, reason="the emulator needs g++")


def _pytest(*args):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(EMU), str(ROOT), os.environ.get("PYTHONPATH")])))
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)


@pytest.mark.slow
def test_gpu_tests_pass_on_the_emulator():
    collected = _pytest("--collect-only", "-q", "-m", "gpu", "tests/test_gpu.py")
    marked = sum("::" in line for line in collected.stdout.splitlines())
    assert marked, collected.stdout + collected.stderr
    run = _pytest("-q", "-m", "gpu", "tests/test_gpu.py")
    summary = run.stdout.strip().splitlines()[-1] if run.stdout.strip() else ""
    counts = {word: int(n) for n, word in re.findall(r"(\d+) (\w+)", summary)}
    assert run.returncode == 0 and counts.get("passed") == marked and not counts.keys() - {"passed", "deselected"}, (
        f"{marked} gpu-marked tests, ran: {summary}\n{run.stdout[-6000:]}{run.stderr[-2000:]}")


# ---------------------------------------------------------------- the emulator itself

KERNELS = r"""
__global__ void shuffles(const int* __restrict__ in, int* __restrict__ out, int arg, int width)
{
    int const i = blockIdx.x * blockDim.x + threadIdx.x, n = gridDim.x * blockDim.x;
    int const v = in[i];
    out[i] = __shfl_down_sync(0xffffffffu, v, arg, width);
    out[n + i] = __shfl_up_sync(0xffffffffu, v, arg, width);
    out[2 * n + i] = __shfl_xor_sync(0xffffffffu, v, arg, width);
    out[3 * n + i] = __shfl_sync(0xffffffffu, v, arg, width);
}

/* lane 0 of each warp waits for the block while the other lanes wait for lane 0 */
__global__ void divergent_barrier(int* out)
{
    int v = threadIdx.x;
    if (threadIdx.x % 32 == 0) __syncthreads();
    v += __shfl_down_sync(0xffffffffu, v, 1);
    out[threadIdx.x] = v;
}

/* out[b] = the block's shared word before anyone wrote it; rev: the block's ids reversed through
 * shared memory, which needs all threads' writes before any read */
__global__ void shared_per_block(unsigned* out, unsigned* rev)
{
    __shared__ unsigned first;
    __shared__ unsigned ids[128];
    if (threadIdx.x == 0) out[blockIdx.x] = first;
    ids[threadIdx.x] = blockIdx.x * 1000 + threadIdx.x;
    __syncthreads();
    if (threadIdx.x == 0) first = 42;
    rev[blockIdx.x * blockDim.x + threadIdx.x] = ids[blockDim.x - 1 - threadIdx.x];
}

__global__ void __launch_bounds__(64) bounded(int* out) { out[threadIdx.x] = threadIdx.x; }

__global__ void conversions(const double* __restrict__ x, int* __restrict__ out, long long n)
{
    for (long long i = threadIdx.x; i < n; i += blockDim.x) out[i] = __double2int_rz(x[i]);
}
"""


@pytest.fixture(scope="module")
def emu():
    """tests/cuda_emu/cuda_emu.py loaded by its path, so that it never shadows a real pycuda."""
    spec = importlib.util.spec_from_file_location("cuda_emu", EMU / "cuda_emu.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.make_current()  # as pycuda.autoprimaryctx does
    return module


def test_no_allocation_or_module_without_a_current_context():
    spec = importlib.util.spec_from_file_location("cuda_emu_fresh", EMU / "cuda_emu.py")
    fresh = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(fresh)
    with pytest.raises(fresh.LogicError, match="cuMemAlloc failed: invalid device context"):
        fresh.to_gpu(np.ones(3))
    with pytest.raises(fresh.LogicError, match="invalid device context"):
        fresh.SourceModule(KERNELS, options=["-fmad=false"])
    fresh.make_current()
    assert fresh.to_gpu(np.ones(3)).get().tolist() == [1.0, 1.0, 1.0]


@pytest.fixture(scope="module")
def kernels(emu):
    return emu.SourceModule(KERNELS, options=["-fmad=false"])


def _cuda_lane(kind, lane, arg, width):
    """The source lane of a shuffle, as the CUDA programming guide defines it."""
    seg = lane - lane % width
    if kind == "down":
        return lane + arg if lane % width + arg < width else lane
    if kind == "up":
        return lane - arg if lane % width >= arg else lane
    if kind == "xor":
        return lane ^ arg if (lane ^ arg) < seg + width else lane
    return seg + arg % width


@pytest.mark.parametrize("arg,width", [(1, 32), (16, 32), (5, 32), (3, 8), (7, 16), (0, 32)])
def test_shuffles_read_the_documented_lanes(emu, kernels, arg, width):
    n = 64  # two warps of one block
    values = np.arange(n, dtype=np.int32) * 7 + 3
    out = emu.zeros(4 * n, np.int32)
    kernels.get_function("shuffles")(emu.to_gpu(values), out, np.int32(arg), np.int32(width),
                                         block=(32, 1, 1), grid=(2, 1))
    got = out.get().reshape(4, n)
    for row, kind in zip(got, ("down", "up", "xor", "idx")):
        expected = [values[32 * (i // 32) + _cuda_lane(kind, i % 32, arg, width)] for i in range(n)]
        np.testing.assert_array_equal(row, expected, err_msg=kind)


def test_a_deadlock_is_an_error_not_a_hang(emu, kernels):
    out = emu.zeros(64, np.int32)
    outcome = []

    def launch():
        try:
            kernels.get_function("divergent_barrier")(out, block=(64, 1, 1), grid=(1, 1))
        except emu.LaunchError as exc:
            outcome.append(str(exc))

    t = threading.Thread(target=launch, daemon=True)
    t.start()
    t.join(60)
    assert not t.is_alive(), "the launch hangs"
    assert outcome and "deadlock" in outcome[0] and "divergent_barrier" in outcome[0], outcome
    # the fibers stuck in it start afresh: the next launch runs
    test_shared_memory_is_per_block(emu, kernels)


def test_shared_memory_is_per_block(emu, kernels):
    first, rev = emu.zeros(3, np.uint32), emu.zeros(3 * 128, np.uint32)
    kernels.get_function("shared_per_block")(first, rev, block=(128, 1, 1), grid=(3, 1))
    assert first.get().tolist() == [0xFFFFFFFF] * 3  # undefined, never block 0's 42
    ids = np.arange(3)[:, None] * 1000 + np.arange(128)[None, ::-1]
    np.testing.assert_array_equal(rev.get(), ids.reshape(-1))


def test_arguments_must_have_the_parameters_types(emu, kernels):
    f = kernels.get_function("conversions")
    x, out = emu.to_gpu(np.zeros(4)), emu.zeros(4, np.int32)
    with pytest.raises(TypeError, match=r"conversions: parameter #2 'n' \(long long\) needs numpy.int64, got numpy.int32"):
        f(x, out, np.int32(4), block=(32, 1, 1))
    with pytest.raises(TypeError, match=r"parameter #2 'n' \(long long\) needs numpy.int64, got int"):
        f(x, out, 4, block=(32, 1, 1))
    with pytest.raises(TypeError, match=r"parameter #0 'x' \(const double\*\) needs numpy.uintp or a GPUArray, got int"):
        f(int(x.gpudata), out, np.int64(4), block=(32, 1, 1))
    with pytest.raises(TypeError, match="conversions takes 3 arguments, got 2"):
        f(x, out, block=(32, 1, 1))
    with pytest.raises(TypeError, match=r"shuffles: parameter #2 'arg' \(int\) needs numpy.int32, got float"):
        kernels.get_function("shuffles")(x, out, 1.0, np.int32(32), block=(32, 1, 1))


def test_a_freed_array_is_no_argument(emu, kernels):
    out = emu.zeros(4, np.int32)
    stale = int(emu.to_gpu(np.zeros(4)).gpudata)  # the array is freed at once
    with pytest.raises(emu.LaunchError, match="no live device allocation"):
        kernels.get_function("conversions")(np.uintp(stale), out, np.int64(4), block=(32, 1, 1))


def test_launch_limits(emu, kernels):
    f = kernels.get_function("bounded")
    out = emu.zeros(128, np.int32)
    with pytest.raises(emu.LaunchError, match="too many resources"):
        f(out, block=(128, 1, 1))
    with pytest.raises(emu.LogicError, match="invalid argument"):
        kernels.get_function("conversions")(out, out, np.int64(0), block=(1025, 1, 1))
    with pytest.raises(emu.LogicError, match="named symbol not found"):
        kernels.get_function("dsz_gemm")


def test_double_to_int_saturates_as_cuda(emu, kernels):
    x = np.array([np.nan, 3e9, -3e9, -2.7, 2.7, 2147483647.9, -2147483648.9, np.inf, -np.inf])
    out = emu.zeros(x.size, np.int32)
    kernels.get_function("conversions")(emu.to_gpu(x), out, np.int64(x.size), block=(32, 1, 1))
    assert out.get().tolist() == [0, 2**31 - 1, -2**31, -2, 2, 2**31 - 1, -2**31, 2**31 - 1, -2**31]
