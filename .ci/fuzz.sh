#!/usr/bin/env bash
# CI fuzzing: build the libFuzzer targets (clang, ASan + UBSan), fuzz each one briefly from the
# committed corpus, and fuzz pydsz's readers with atheris; fails on any finding (crash, failed
# check, leak, timeout, out-of-memory, an exception other than DszError).
#   .ci/fuzz.sh [PYTHON]      PYTHON: an interpreter with pydsz installed (default .venv-ci/bin/python)
# FUZZ_SECONDS (default 60) is each target's time; two run at a time (about 3.5 minutes on 2 cores).
# The corpus replay without fuzzing is part of the test suite (tests/test_fuzz_replay.py).
set -euo pipefail
cd "$(dirname "$0")/.."
python=${1:-.venv-ci/bin/python}
[ -x "$python" ] || python=python3
seconds=${FUZZ_SECONDS:-60}
export DEBIAN_FRONTEND=noninteractive

libfuzzer_works() {
    command -v clang >/dev/null &&
        echo 'int LLVMFuzzerTestOneInput(const char* d, unsigned long n) { return d && n > 1 << 30; }' |
        clang -fsanitize=fuzzer,address,undefined -x c -o /dev/null - 2>/dev/null
}
if ! libfuzzer_works; then
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends clang libclang-rt-14-dev make libc6-dev >/dev/null
fi
"$python" -c "import atheris" 2>/dev/null || "$python" -m pip install -q atheris

make -s -C libdsz/fuzz fuzz
out=libdsz/fuzz/build/ci
rm -rf "$out"
mkdir -p "$out"

# one target in its own scratch corpus and artifact folder; the log says what it found
fuzz_c() {
    local t=$1
    mkdir -p "$out/corpus_$t" "$out/artifacts_$t"
    make -s -C libdsz/fuzz run T="$t" TIME="$seconds" \
        "CORPUS_DIR=build/ci/corpus_$t" "ARTIFACTS_DIR=build/ci/artifacts_$t" >"$out/$t.log" 2>&1
}
fuzz_python() {
    mkdir -p "$out/corpus_load" "$out/artifacts_load"
    "$python" tests/fuzz_load.py -max_total_time="$seconds" -max_len=8192 -timeout=10 -rss_limit_mb=2048 \
        -print_final_stats=1 -artifact_prefix="$out/artifacts_load/" "$out/corpus_load" \
        libdsz/fuzz/corpus/dsz libdsz/fuzz/corpus/dszu libdsz/fuzz/corpus/array libdsz/fuzz/corpus/sparse >"$out/load.log" 2>&1
}

failed=0
report() {
    local name=$1 rc=$2 log="$out/$1.log"
    local execs
    execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log")
    if [ "$rc" -ne 0 ] || [ -n "$(ls -A "$out/artifacts_$name")" ]; then
        echo "fuzz $name: FINDING (exit $rc), artifacts in $out/artifacts_$name/" >&2
        tail -n 40 "$log" >&2
        failed=1
    else
        echo "fuzz $name: ${execs:-?} executions in ${seconds} s, nothing found"
    fi
}

set +e
pairs=("header array delta" "sparse index" "roundtrip load")
for pair in "${pairs[@]}"; do
    pids=()
    for name in $pair; do
        if [ "$name" = load ]; then fuzz_python & else fuzz_c "$name" & fi
        pids+=($!)
    done
    i=0
    for name in $pair; do
        wait "${pids[$i]}"
        report "$name" $?
        i=$((i + 1))
    done
done
set -e
exit $failed
