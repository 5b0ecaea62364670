#!/usr/bin/env bash
# One GPU call for the Grid planner's estimation (grid_and_boundaries.md section 12): the GPU tests
# named in $TESTS, then RUNS processes of the 128K Grid benchmark (each its own process: host speed
# differs between processes), with LONG=1 one process at 512K and 1M, with PROFILE=1 the host
# profile. JSON, test logs and the profile go to $OUT (benchmark logs to /tmp, shown on failure).
#   TESTS="paths..." [TESTS_TIMEOUT=s] [LONG=1] [PROFILE=1] bash scripts/grid_graph_gpu.sh TAG [RUNS]
set -uo pipefail
source scripts/gpu_env.sh
export PYTHONPATH=$SRC_PATH:scripts TRITON_INTERPRET=0
TAG=$1; RUNS=${2:-3}
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"; date -u; } > $OUT/env.txt 2>&1
if [ -n "${TESTS:-}" ]; then
  timeout ${TESTS_TIMEOUT:-400} python3 -m pytest $TESTS -m "not slow" -q -n 8 -p no:cacheprovider > $OUT/tests-$TAG.txt 2>&1
  tail -3 $OUT/tests-$TAG.txt
fi
for r in $(seq 1 $RUNS); do
  timeout 200 python3 -m pytest packages/sparse-patterns/benchmarks/bench_grid.py -k "test_grid_vs_dense and 128K and ours" \
    --benchmark-only --benchmark-json=$OUT/g128-$TAG-run$r.json -p no:cacheprovider -o python_files='bench_*.py' -q > /tmp/g128-$TAG-run$r.log 2>&1 || tail -20 /tmp/g128-$TAG-run$r.log
  python3 scripts/bench_summary.py $OUT/g128-$TAG-run$r.json
done
if [ -n "${LONG:-}" ]; then
  timeout 300 python3 -m pytest packages/sparse-patterns/benchmarks/bench_grid.py -k "test_grid_vs_dense and (512K or 1M) and ours" \
    --benchmark-only --benchmark-json=$OUT/g512k-1m-$TAG.json -p no:cacheprovider -o python_files='bench_*.py' -q > /tmp/g512k-1m-$TAG.log 2>&1 || tail -20 /tmp/g512k-1m-$TAG.log
  python3 scripts/bench_summary.py $OUT/g512k-1m-$TAG.json
fi
if [ -n "${PROFILE:-}" ]; then
  timeout 200 python3 scripts/grid_host_profile.py --seq 131072 > $OUT/profile-$TAG.txt 2>&1; head -3 $OUT/profile-$TAG.txt
fi
