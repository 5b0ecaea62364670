#!/usr/bin/env bash
# One call on a lent GPU machine: install the carried wheels (nox), print the machine, then run the
# nox sessions named in $GPU_STEPS. Logs and benchmark JSON go to $OUT.
#   GPU_STEPS="tests bench" TESTS="paths..." BENCHES="paths..." bash scripts/gpu_session.sh
# Any other step is a bash command; in it, `pybench NAME ARGS...` runs pytest-benchmark on ARGS
# (files, -k filters) with the packages' sources on the path and writes $OUT/NAME.json.
set -uo pipefail
source "$(dirname "$0")/gpu_env.sh"
{
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
  python3 -c "import torch, triton, transformers; print('torch', torch.__version__, 'triton', triton.__version__, 'transformers', transformers.__version__, 'cuda', torch.version.cuda)"
  date -u
} 2>&1 | tee "$OUT/env.txt"
pybench() {
  local name=$1; shift
  PYTHONPATH=$SRC_PATH${PYTHONPATH:-} \
    TRITON_INTERPRET=0 python3 -m pytest "$@" --benchmark-only --benchmark-json="$OUT/$name.json" \
    -p no:cacheprovider -o python_files='bench_*.py' -q
}
export -f pybench
rc=0
for step in ${GPU_STEPS:-tests bench}; do
  case $step in
    tests) python3 -m nox -s gpu-tests -- ${TESTS:-} -q 2>&1 | tee "$OUT/gpu-tests.log"; rc=$((rc | ${PIPESTATUS[0]})) ;;
    bench) BENCH_OUT=$OUT python3 -m nox -s bench -- ${BENCHES:-} 2>&1 | tee "$OUT/bench.log"; rc=$((rc | ${PIPESTATUS[0]})) ;;
    *) bash -c "$step" 2>&1 | tee -a "$OUT/extra.log"; rc=$((rc | ${PIPESTATUS[0]})) ;;
  esac
done
exit $rc
