#!/bin/bash
# One GPU session's checks in one command (doc/gpu.md), on the device machine, from the repository
# root, with .whl/ from fetch_pycuda.sh (plus ai-edge-litert and tflite wheels for its Python) and,
# where Debian's dataset is missing there, Fashion-MNIST's IDX files in .fmnist/. In order of worth,
# each step under its own time limit so that a slow one leaves the rest their time:
#   install      pycuda built from its sdist, pydsz's extension in place
#   test_gpu     the gpu-marked tests on the real GPU
#   e2e          dsz compress and dsz prune, --device gpu against --device cpu, on the bundled LeNet-300-100
#   large_*      bench/large_models.py on the GPU (retraining and the tail's evaluations), per model
#   gpu_sweep    bench/gpu_sweep.py: the assessment sweep, numpy against the GPU
# Logs and JSON land in $OUT (the device tool brings them back). SECONDS_TOTAL bounds the whole run.
set -u
OUT=${OUT:-/tmp/gpu-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
END=$((SECONDS + ${SECONDS_TOTAL:-540}))
step() {  # step NAME MAX_SECONDS COMMAND...: log to $OUT/NAME.log, at most MAX_SECONDS and what is left
    local name=$1 limit=$2 left=$((END - SECONDS))
    shift 2
    [ "$left" -lt "$limit" ] && limit=$left
    if [ "$limit" -lt 20 ]; then echo "== $name: skipped, ${left}s left"; return 1; fi
    echo "== $name (at most ${limit}s)"
    timeout "$limit" "$@" >"$OUT/$name.log" 2>&1
    local rc=$?
    echo "== $name: rc $rc after $((SECONDS))s"
    tail -n 8 "$OUT/$name.log"
    return $rc
}
step install 240 ./bench/setup/install_pycuda.sh || exit 1
export PYTHONPATH=/tmp/site:$PWD
[ -d .fmnist ] && export DSZ_FASHION_MNIST_DIR=$PWD/.fmnist
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
step test_gpu 150 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_gpu.py
# dsz compress on both devices, then dsz prune on both: the GPU's .dsz must be the CPU's byte for
# byte; retraining differs in summation order only, so its top-1 is close, not equal
e2e() {
    local t d
    set -o pipefail
    t=$(mktemp -d)
    python3 - "$t" <<'PY' || return 1
import sys
import numpy as np
from pydsz.model.data import fashion_mnist, split_validation
(x, y), (xv, yv) = split_validation(*fashion_mnist("train"))
np.savez(f"{sys.argv[1]}/train.npz", x=x[:10000].astype(np.float32), y=y[:10000])
np.savez(f"{sys.argv[1]}/val.npz", x=xv[:1000].astype(np.float32), y=yv[:1000])
PY
    for d in gpu cpu; do
        python3 -m pydsz.cli compress pydsz/data/lenet300.tflite --data "$t/val.npz" --device $d \
            --num-threads 2 -o "$t/$d.dsz" | tail -n 2 || return 1
    done
    cmp "$t/gpu.dsz" "$t/cpu.dsz" && echo "same .dsz on both devices ($(stat -c %s "$t/gpu.dsz") bytes)" || return 1
    for d in gpu cpu; do
        echo "-- prune --device $d"
        python3 -m pydsz.cli prune pydsz/data/lenet300.tflite --method retrain --train "$t/train.npz" \
            --data "$t/val.npz" --sparsity 0.9 --epochs 4 --device $d --num-threads 2 -o "$t/$d.tflite" | tail -n 3 \
            || return 1
    done
}
export -f e2e
step e2e 100 bash -c e2e
for model in ${LARGE_MODELS-alexnet vgg16}; do
    step "large_$model" "${LARGE_SECONDS:-240}" python3 bench/large_models.py --models "$model" --device gpu \
        --num-threads "$(nproc)" --epochs "${LARGE_EPOCHS:-8}"
done
cp bench/results/large_models.json "$OUT/" 2>/dev/null
step gpu_sweep 200 python3 bench/gpu_sweep.py
cp bench/results/gpu_sweep.json "$OUT/" 2>/dev/null
echo "== done after ${SECONDS}s"
