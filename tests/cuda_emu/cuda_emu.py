"""The CUDA emulator's Python side: the parts of pycuda that pydsz uses, over emu.cpp (README.md).

tests/cuda_emu/pycuda re-exports these under pycuda's module names; tests/test_gpu_emulated.py
loads this module by its path, so that it never shadows a real pycuda.
"""

from __future__ import annotations

import bisect
import ctypes
import hashlib
import os
import re
import subprocess
import tempfile
import weakref
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
BUILD = HERE / ".build"
CXX = os.environ.get("CXX", "g++")
# -ffp-contract=off: no a * b + c fused behind the kernel's back (nvcc -fmad=false); -march=native:
# inline FMA instructions and vectors make the GEMM kernel 3 times faster than libm's fmaf (each
# still one correctly rounded operation); -fno-strict-aliasing: CUDA code reads float arrays as float4.
FLAGS = ["-std=c++17", "-O2", "-march=native", "-ffp-contract=off", "-fno-fast-math", "-fno-strict-aliasing",
         "-fPIC", "-shared"]
# CUDA_EMU_ASAN=1: needs LD_PRELOAD=$(g++ -print-file-name=libasan.so) (README.md)
SANITIZE = ["-fsanitize=address,undefined", "-fsanitize-sections=emu_shared", "-fno-sanitize-recover=all",
            "-fno-omit-frame-pointer", "-g"]
if os.environ.get("CUDA_EMU_ASAN") == "1":
    FLAGS += SANITIZE

# The options whose meaning the emulator has: IEEE float and double, each operation rounded once.
# Without -fmad=false nvcc fuses a * b + c where it likes, which no CPU build can follow.
OPTIONS = {"-fmad=false", "-ftz=false", "-prec-div=true", "-prec-sqrt=true"}


# ---------------------------------------------------------------- pycuda.driver

DEVICE_NAME = "pydsz CPU emulator (tests/cuda_emu)"


class Error(Exception):
    pass


class LogicError(Error):
    pass


class LaunchError(Error):
    pass


class CompileError(Error):
    pass


def init(flags: int = 0) -> None:
    pass


# pycuda.autoprimaryctx / autoinit make a context current; without one CUDA refuses allocations and
# modules, as here (a real GPU found pydsz uploading before any import made one current)
_current = {"context": False}


def make_current() -> None:
    _current["context"] = True


def _need_context(call: str) -> None:
    if not _current["context"]:
        raise LogicError(f"{call} failed: invalid device context")


class Device:
    def __init__(self, ordinal: int):
        if ordinal != 0:
            raise LogicError("cuDeviceGet failed: invalid device ordinal")

    @staticmethod
    def count() -> int:
        return 1

    def name(self) -> str:
        return DEVICE_NAME


# ---------------------------------------------------------------- device memory

_libc = ctypes.CDLL(None)
_libc.posix_memalign.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t, ctypes.c_size_t]
_libc.free.argtypes = [ctypes.c_void_p]
_starts: list[int] = []  # live allocations, sorted, for the check of pointer arguments
_ends: dict[int, int] = {}


def _release(addr: int) -> None:
    del _starts[bisect.bisect_left(_starts, addr)]
    del _ends[addr]
    _libc.free(addr)


class DeviceAllocation:
    """nbytes of malloc'd memory, 256-byte aligned as cudaMalloc's; exactly nbytes, so that
    AddressSanitizer, when loaded, poisons the byte after the end."""

    def __init__(self, nbytes: int):
        _need_context("cuMemAlloc")
        p = ctypes.c_void_p()
        if _libc.posix_memalign(ctypes.byref(p), 256, nbytes):
            raise MemoryError(f"cannot allocate {nbytes} bytes")
        self._addr = p.value
        self._nbytes = nbytes
        bisect.insort(_starts, self._addr)
        _ends[self._addr] = self._addr + nbytes
        weakref.finalize(self, _release, self._addr)

    def __int__(self) -> int:
        return self._addr

    __index__ = __int__

    def view(self, dtype) -> np.ndarray:
        """The memory as a numpy array; the caller keeps this allocation alive while it uses it."""
        raw = (ctypes.c_char * self._nbytes).from_address(self._addr)
        return np.frombuffer(raw, np.uint8).view(dtype)


def _allocated(addr: int) -> bool:
    i = bisect.bisect_right(_starts, addr) - 1
    return i >= 0 and addr <= _ends[_starts[i]]  # one past the end is a valid pointer too


# ---------------------------------------------------------------- pycuda.gpuarray


class GPUArray:
    def __init__(self, shape, dtype):
        self.shape = tuple(int(s) for s in shape) if isinstance(shape, (tuple, list)) else (int(shape),)
        self.dtype = np.dtype(dtype)
        self.size = int(np.prod(self.shape))
        self.nbytes = self.size * self.dtype.itemsize
        # pycuda allocates nothing for an empty array: its gpudata is None, as here
        self.gpudata = DeviceAllocation(self.nbytes) if self.size else None
        self._host = (self.gpudata.view(self.dtype) if self.size else np.empty(0, self.dtype)).reshape(self.shape)
        # device memory comes uninitialised: make reading it before writing show (NaN, huge counts)
        self._host.view(np.uint8)[...] = 0xFF

    def get(self) -> np.ndarray:
        return self._host.copy()

    def fill(self, value) -> GPUArray:
        self._host[...] = value
        return self

    def copy(self) -> GPUArray:
        out = GPUArray(self.shape, self.dtype)
        out._host[...] = self._host
        return out


def to_gpu(ary) -> GPUArray:
    a = np.asarray(ary)
    out = GPUArray(a.shape, a.dtype)
    out._host[...] = a
    return out


def empty(shape, dtype) -> GPUArray:
    return GPUArray(shape, dtype)


def zeros(shape, dtype=np.float64) -> GPUArray:
    return GPUArray(shape, dtype).fill(0)


# ---------------------------------------------------------------- modules

_COMMENT = re.compile(r"//[^\n]*|/\*.*?\*/", re.S)
_KERNEL = re.compile(r"__global__\s+(?:void\s+)?(?:__launch_bounds__\s*\(([^)]*)\)\s*)?(?:void\s+)?(\w+)\s*\(([^)]*)\)")


def _kernels(source: str) -> list[tuple[str, str, list[tuple[str, str]]]]:
    """(name, max threads expression, [(parameter type as written, name)]) of each __global__ function."""
    out = []
    for bounds, name, params in _KERNEL.findall(_COMMENT.sub(" ", source)):
        parsed = []
        for p in filter(None, (p.strip() for p in params.split(","))):
            if p != "void":
                m = re.fullmatch(r"(.*?)(\w+)", p, re.S)
                parsed.append((" ".join(m.group(1).replace("__restrict__", "").split()), m.group(2)))
        out.append((name, bounds.split(",")[0].strip() or "1024", parsed))
    return out


def _table(kernels) -> str:
    rows = "".join(f'    {{"{n}", emu::trampoline<&{n}>, emu::signature<&{n}>, (unsigned)({b})}},\n' for n, b, _ in kernels)
    return f'extern "C" const emu::Kernel emu_kernels[] = {{\n{rows}    {{nullptr, nullptr, nullptr, 0}}}};\n'


def _build(unit: str, include_dirs) -> Path:
    emu_sources = [HERE / "cuda_emu.h", HERE / "emu.cpp"]
    flags = FLAGS + [f"-I{d}" for d in include_dirs]
    cpu = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""  # for -march=native
    key = hashlib.sha256("\0".join([unit, CXX, cpu, *flags, *(p.read_text() for p in emu_sources)]).encode()).hexdigest()
    lib = BUILD / f"{key[:24]}.so"
    if lib.exists():
        return lib
    BUILD.mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory(dir=BUILD) as tmp:
        src = Path(tmp) / "kernel.cpp"
        src.write_text(unit)
        out = Path(tmp) / "module.so"
        r = subprocess.run([CXX, *flags, f"-I{HERE}", str(src), str(HERE / "emu.cpp"), "-o", str(out)],
                           capture_output=True, text=True)
        if r.returncode:
            raise CompileError(f"g++ could not compile the module for the emulator:\n{r.stderr}")
        os.replace(out, lib)  # atomic: a concurrent build of the same key is harmless
    return lib


class SourceModule:
    def __init__(self, source: str, options=None, no_extern_c: bool = False, include_dirs=()):
        _need_context("cuModuleLoadDataEx")
        options = list(options or [])
        unknown = [o for o in options if o not in OPTIONS]
        if unknown or "-fmad=false" not in options:
            raise ValueError(f"options {options}: the emulator computes as {sorted(OPTIONS)} ask and needs "
                             "-fmad=false (else nvcc fuses multiply-adds the CPU cannot know of)")
        if not no_extern_c:
            source = f'extern "C" {{\n{source}\n}}\n'  # as pycuda wraps it
        kernels = _kernels(source)
        self._kernels = {name: params for name, _, params in kernels}
        unit = f'#include "cuda_emu.h"\n#line 1 "kernel.cu"\n{source}\n#line 1 "emulator kernel table"\n{_table(kernels)}'
        self._lib = ctypes.CDLL(str(_build(unit, include_dirs)))
        self._lib.emu_signature.restype = ctypes.c_char_p
        self._lib.emu_launch.argtypes = [ctypes.c_char_p, ctypes.POINTER(ctypes.c_void_p)] + [ctypes.c_uint] * 6 + [
            ctypes.c_char_p, ctypes.c_size_t]

    def get_function(self, name: str) -> Function:
        # pycuda finds an entry point by its symbol: a kernel without C linkage has a mangled one
        if name not in self._kernels or not hasattr(self._lib, name):
            raise LogicError(f"cuModuleGetFunction failed: named symbol not found ({name})")
        return Function(self._lib, name, self._kernels[name])


# ---------------------------------------------------------------- launches

def _typename(v) -> str:
    t = type(v)
    return f"numpy.{t.__name__}" if t.__module__ == "numpy" else t.__name__


class Function:
    def __init__(self, lib, name: str, params: list[tuple[str, str]]):
        self._lib = lib
        self.name = name
        codes = lib.emu_signature(name.encode()).decode().split(",")[:-1]
        if len(codes) != len(params):
            raise RuntimeError(f"{name}: read {len(params)} parameters in the source, the compiler has {len(codes)}")
        self._params = [(ptype, pname, code) for (ptype, pname), code in zip(params, codes)]

    def _value(self, i: int, ptype: str, pname: str, code: str, arg) -> np.ndarray:
        """arg as the bytes of parameter i, if it has exactly the parameter's type.

        A real launch packs a numpy scalar by its own width, whatever the parameter is: an int64 for
        an int shifts every later parameter. So a wrong width is an error here, never converted."""
        where = f"{self.name}: parameter #{i} '{pname}' ({ptype})"
        if code == "?":
            raise TypeError(f"{where}: the emulator passes scalars and pointers only")
        want = np.dtype(np.uintp if code == "P" else code)
        if code == "P" and hasattr(arg, "gpudata"):
            if arg.gpudata is None:
                raise TypeError(f"{where}: an empty GPUArray has no device memory")
            arg = np.uintp(int(arg.gpudata))
        if not (isinstance(arg, np.generic) and arg.dtype == want):
            need = "numpy.uintp or a GPUArray" if code == "P" else f"numpy.{want.name}"
            raise TypeError(f"{where} needs {need}, got {_typename(arg)}")
        if code == "P" and arg and not _allocated(int(arg)):
            raise LaunchError(f"{where} = {int(arg):#x} points into no live device allocation (freed? host memory?)")
        return np.array(arg, want)

    def __call__(self, *args, block, grid=(1, 1)):
        if len(args) != len(self._params):
            raise TypeError(f"{self.name} takes {len(self._params)} arguments, got {len(args)}")
        values = [self._value(i, *p, a) for i, (p, a) in enumerate(zip(self._params, args))]
        block, grid = (tuple(int(d) for d in dims) + (1,) * (3 - len(dims)) for dims in (block, grid))
        if (len(block) != 3 or min(block) < 1 or max(block[:2]) > 1024 or block[2] > 64
                or block[0] * block[1] * block[2] > 1024):
            raise LogicError(f"cuLaunchKernel failed: invalid argument ({self.name}: block {block})")
        if len(grid) != 3 or min(grid) < 1 or grid[0] >= 2**31 or max(grid[1:]) > 65535:
            raise LogicError(f"cuLaunchKernel failed: invalid argument ({self.name}: grid {grid})")
        argv = (ctypes.c_void_p * max(1, len(values)))(*[v.ctypes.data for v in values])
        err = ctypes.create_string_buffer(1024)
        if self._lib.emu_launch(self.name.encode(), argv, *grid, *block, err, len(err)):
            raise LaunchError(f"cuLaunchKernel failed: {err.value.decode()}")
