#!/usr/bin/env bash
# A long fuzzing campaign of one target, at the lowest priority, one process:
#   [MAXLEN=BYTES] libdsz/fuzz/campaign.sh TARGET SECONDS [RUNS]
# TARGET: header, array, sparse, index, roundtrip (libFuzzer), or load (tests/fuzz_load.py under
# atheris, with $PYTHON, default python3, which must import pydsz and atheris).
# MAXLEN overrides the target's longest input (the Makefile's MAXLEN_TARGET).
# Stops after SECONDS or RUNS inputs, whichever comes first; the log goes to
# build/campaign_TARGET.log and a record (executions, time, exec/s, findings) is appended to
# campaigns.json. Exits non-zero if the fuzzer found anything (build/artifacts_TARGET/).
set -euo pipefail
cd "$(dirname "$0")"
target=$1 seconds=$2 runs=${3:--1}
log=build/campaign_"$target".log
mkdir -p build/corpus_"$target" build/artifacts_"$target"
started=$(date -u +%Y-%m-%dT%H:%M:%SZ)
# what was fuzzed: the commit, and whether libdsz's sources differed from it
commit=$(git rev-parse --short HEAD)
git diff --quiet HEAD -- ../src ../include || commit="$commit+uncommitted"
rc=0
if [ "$target" = load ]; then
    nice -n 19 "${PYTHON:-python3}" ../../tests/fuzz_load.py -max_total_time="$seconds" -runs="$runs" \
        -max_len=8192 -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
        -artifact_prefix=build/artifacts_load/ build/corpus_load corpus/dsz corpus/array corpus/sparse \
        >"$log" 2>&1 || rc=$?
else
    make -s build/fuzz_"$target"
    nice -n 19 make -s run T="$target" TIME="$seconds" RUNS="$runs" ${MAXLEN:+MAXLEN_$target=$MAXLEN} \
        >"$log" 2>&1 || rc=$?
fi
python3 - "$target" "$log" "$started" "$rc" "$commit" <<'PY'
import json, os, re, subprocess, sys
target, log, started, rc, commit = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5]
text = open(log, errors="replace").read()
stat = dict(re.findall(r"^stat::(\w+):\s+(\d+)", text, re.M))
done = re.search(r"^Done (\d+) runs in (\d+) second", text, re.M)
artifacts = sorted(os.listdir(f"build/artifacts_{target}")) if os.path.isdir(f"build/artifacts_{target}") else []
clang = subprocess.run(["clang", "--version"], capture_output=True, text=True).stdout.splitlines()[0]
record = {
    "target": target, "started": started, "commit": commit, "clang": clang,
    "executions": int(stat.get("number_of_executed_units", 0)),
    "seconds": int(done.group(2)) if done else None,
    "exec_per_sec": int(stat.get("average_exec_per_sec", 0)),
    "new_units": int(stat.get("new_units_added", 0)),
    "peak_rss_mb": int(stat.get("peak_rss_mb", 0)),
    "max_len": max(map(int, re.findall(r" lim: (\d+)", text)), default=None),  # the input length limit reached
    "exit_status": rc, "artifacts": artifacts,
}
path = "campaigns.json"
records = json.load(open(path)) if os.path.exists(path) else []
records.append(record)
with open(path, "w") as f:
    json.dump(records, f, indent=1)
    f.write("\n")
print(json.dumps(record))
PY
if [ "$rc" -ne 0 ] || [ -n "$(ls -A build/artifacts_"$target")" ]; then
    echo "campaign $target: findings in build/artifacts_$target (log $log)" >&2
    exit 1
fi
