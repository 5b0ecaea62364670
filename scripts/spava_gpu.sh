#!/usr/bin/env bash
# One call on a multi-GPU machine (nvidia-h200-x2 / -x4): NCCL correctness tests, the Spava
# benchmark under torchrun, and spava-run's tiny demo under accelerate launch. Logs/JSON in $OUT.
#   SPAVA_SEQS=262144 SPAVA_HOSTS="4 2" bash scripts/spava_gpu.sh
set -uo pipefail
source "$(dirname "$0")/gpu_env.sh"
export PYTHONPATH=$SRC_PATH${PYTHONPATH:-}
export TRITON_INTERPRET=0
{
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
  nvidia-smi topo -m
  python3 -c "import torch, triton, transformers, accelerate; print('torch', torch.__version__, 'triton', triton.__version__, 'transformers', transformers.__version__, 'accelerate', accelerate.__version__, 'cuda', torch.version.cuda)"
  date -u
} 2>&1 | tee "$OUT/env.txt"
NGPU=$(nvidia-smi -L | wc -l)
rc=0
timeout ${TEST_TIMEOUT:-200} python3 -m pytest packages/seqpar-approx/tests/test_gpu.py -p no:cacheprovider -q -rs \
  2>&1 | tee "$OUT/spava-gpu-tests.log"; rc=$((rc | ${PIPESTATUS[0]}))
timeout 120 accelerate launch --num_processes "$NGPU" --num_machines 1 --mixed_precision no --dynamo_backend no \
  -m spava_run.cli --tiny-demo --json "$OUT/spava-run-demo.json" 2>&1 | tail -40 | tee "$OUT/spava-run-demo.log"
rc=$((rc | ${PIPESTATUS[0]}))
for h in ${SPAVA_HOSTS:-$NGPU}; do
  [ "$h" -le "$NGPU" ] || continue
  timeout ${BENCH_TIMEOUT:-240} torchrun --nproc-per-node "$h" packages/seqpar-approx/benchmarks/bench_spava.py \
    --seq-lens "${SPAVA_SEQS:-262144}" --modes "${SPAVA_MODES:-model,attention}" --reps "${SPAVA_REPS:-2}" \
    --out "$OUT/bench_spava_h$h.json" ${SPAVA_ARGS:-} 2>&1 | grep -v "^\s*warnings.warn\|UserWarning" | tail -60 \
    | tee "$OUT/bench_spava_h$h.log"
  rc=$((rc | ${PIPESTATUS[0]}))
done
exit $rc
