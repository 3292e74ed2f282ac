#!/bin/sh
# On the GPU machine, offline: install the wheels bench/setup/fetch_pycuda.sh put in .whl/ into
# /tmp/site, build pycuda from its sdist against the local CUDA, and build pydsz's extension
# in place. Then: export PYTHONPATH=/tmp/site:$PWD
# CURAND is left out when its header is missing (pydsz does not use it).
set -eu
CUDA_ROOT=${CUDA_ROOT:-$(dirname "$(dirname "$(command -v nvcc)")")}
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    .whl/*.whl
export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
rm -rf /tmp/pycuda-src && mkdir -p /tmp/pycuda-src
tar xzf .whl/pycuda-*.tar.gz -C /tmp/pycuda-src --strip-components 1
# CURAND is on by default: the option is there only to turn it off
CURAND=
[ -f "$CUDA_ROOT/include/curand.h" ] || CURAND=--no-cuda-enable-curand
# -lcuda needs an unversioned libcuda.so: the toolkit's stub, else a link to the driver's library
mkdir -p /tmp/cudalib
DRIVER=$(ldconfig -p | awk '/libcuda\.so/ {print $NF; exit}')
if [ -n "$DRIVER" ]; then ln -sf "$DRIVER" /tmp/cudalib/libcuda.so; fi
LIBDIRS=$CUDA_ROOT/lib64/stubs,$CUDA_ROOT/lib/stubs,$CUDA_ROOT/lib64,/tmp/cudalib
# build_ext -j compiles in parallel; pip's in-tree build then reuses the objects
(cd /tmp/pycuda-src && python3 configure.py --cuda-root="$CUDA_ROOT" --cudadrv-lib-dir="$LIBDIRS" $CURAND >/dev/null &&
    python3 setup.py -q build_ext -j "$(nproc)" >/dev/null &&
    python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-cache-dir \
        --target /tmp/site .)
python3 setup.py -q build_ext --inplace
python3 -c "import pycuda.driver as d; d.init(); print('pycuda', __import__('pycuda').VERSION_TEXT, d.Device(0).name())"
