source scripts/gpu_env.sh
export PYTHONPATH=$SRC_PATH${PYTHONPATH:-}
source <(sed -n '/^pybench()/,/^}/p' scripts/gpu_session.sh)
nvidia-smi --query-gpu=name --format=csv,noheader
SPARSE_KERNELS_AUTOTUNE=0 timeout 150 python3 -m pytest -q -p no:cacheprovider -n 12 -m "not slow" \
  packages/sparse-kernels/tests/test_estimate.py packages/sparse-kernels/tests/test_permuted.py packages/sparse-patterns/tests \
  > $OUT/gpu-tests.log 2>&1; echo "tests rc=$?"; tail -2 $OUT/gpu-tests.log
for S in 131072 524288; do timeout 60 python3 scripts/profile_estimation.py --seq $S --rows 14 > $OUT/profile-$S.txt 2>&1; grep -E "plan_layer|_lines_kernel|_lse_kernel|_grid_lists|Self CUDA time total|cudaLaunchKernel" $OUT/profile-$S.txt | cut -c1-60,100-170; done
timeout 330 bash -c "$(declare -f pybench); pybench grid packages/sparse-patterns/benchmarks/bench_grid.py -k 'test_grid_vs_dense'"
python3 scripts/bench_summary.py $OUT/grid.json
