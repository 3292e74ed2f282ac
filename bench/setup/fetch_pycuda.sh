#!/bin/sh
# Download what the GPU machine lacks for pydsz's GPU path into .whl/ (git-ignored): pycuda's
# sdist, its pure-Python dependencies, and wheels of the compiled ones for that machine's
# Python (3.12 by default: PY=3.11 ./bench/setup/fetch_pycuda.sh for another). numpy, setuptools,
# wheel, cython, markupsafe, typing_extensions and pytest are already there.
# Run from the repository root on a machine with network access; then, on the GPU machine,
# bench/setup/install_pycuda.sh builds and installs them offline (doc/gpu.md).
set -eu
PY=${PY:-3.12}
mkdir -p .whl
rm -f .whl/pycuda-* .whl/pytools-* .whl/platformdirs-* .whl/mako-* .whl/siphash24-* .whl/zstandard-*
pip download --no-deps --dest .whl --no-binary pycuda "pycuda>=2022.1"
pip download --no-deps --dest .whl pytools platformdirs mako
pip download --no-deps --dest .whl --only-binary=:all: --python-version "$PY" --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    siphash24 zstandard
ls -l .whl
