"""Build pydsz's extension: the Cython binding compiled together with libdsz's C99 sources."""
import glob
import sys

import numpy
from Cython.Build import cythonize
from setuptools import Extension, setup

# the decoders write host-order floats into little-endian .tflite buffers (doc/format.md)
if sys.byteorder != "little":
    sys.exit("pydsz supports little-endian hosts only (x86-64, ARM, RISC-V); big-endian hosts are out of scope")

# -O3 for the decoder's hot loops; hidden visibility exports only the module's init function and
# dsz.h's functions (DSZ_API), none of libdsz's internals; MSVC takes its own flags
extra = [] if sys.platform == "win32" else ["-O3", "-std=c99", "-Wall", "-Wextra", "-fvisibility=hidden"]
# linked stripped on Linux: the symbols and the debug information of CPython's -g are 80% of the
# extension (2.0 MB, 359 KB stripped), and a device has no use for them
link = ["-s"] if sys.platform.startswith("linux") else []

core = Extension(
    "pydsz._core",
    sources=["pydsz/_core.pyx"] + sorted(glob.glob("libdsz/src/*.c")),
    include_dirs=["libdsz/include", "libdsz/src", numpy.get_include()],
    define_macros=[("NPY_NO_DEPRECATED_API", "NPY_1_7_API_VERSION")],
    extra_compile_args=extra,
    extra_link_args=link,
)

setup(ext_modules=cythonize([core], language_level=3))
