source scripts/gpu_env.sh
export PYTHONPATH=$SRC_PATH${PYTHONPATH:-}
source <(sed -n '/^pybench()/,/^}/p' scripts/gpu_session.sh)
nvidia-smi --query-gpu=name --format=csv,noheader
SPARSE_KERNELS_AUTOTUNE=0 timeout 150 python3 -m pytest -q -p no:cacheprovider -n 12 -m "not slow" \
  packages/sparse-kernels/tests/test_estimate.py packages/sparse-patterns/tests/test_plan.py \
  packages/sparse-patterns/tests/test_estimate.py packages/sparse-patterns/tests/test_sync.py \
  packages/sparse-patterns/tests/test_search.py > $OUT/gpu-tests.log 2>&1; echo "tests rc=$?"; tail -3 $OUT/gpu-tests.log
for S in 131072 524288; do timeout 60 python3 scripts/profile_estimation.py --seq $S --rows 12 > $OUT/profile-$S.txt 2>&1; grep -E "plan_layer|_lines_kernel|_lse_kernel|Self CUDA time total" $OUT/profile-$S.txt | cut -c1-60,100-170; done
timeout 330 bash -c "$(declare -f pybench); pybench grid packages/sparse-patterns/benchmarks/bench_grid.py -k 'test_grid_vs_dense'"
python3 scripts/bench_summary.py $OUT/grid.json
