source scripts/gpu_env.sh
export PYTHONPATH=$SRC_PATH${PYTHONPATH:-}
source <(sed -n '/^pybench()/,/^}/p' scripts/gpu_session.sh)
nvidia-smi --query-gpu=name --format=csv,noheader
SPARSE_KERNELS_AUTOTUNE=0 timeout 170 python3 -m pytest -q -p no:cacheprovider -n 12 -m "not slow" \
  packages/sparse-kernels/tests/test_estimate.py packages/sparse-kernels/tests/test_permuted.py packages/sparse-patterns/tests \
  > $OUT/gpu-tests.log 2>&1; echo "tests rc=$?"; tail -2 $OUT/gpu-tests.log
timeout 60 python3 scripts/profile_estimation.py --seq 524288 --rows 14 > $OUT/profile-524288.txt 2>&1; grep -E "plan_layer|_lines_kernel|_lse_kernel|_grid_lists|_split|Self CUDA time total|cudaLaunchKernel" $OUT/profile-524288.txt | cut -c1-60,100-170
timeout 200 bash -c "$(declare -f pybench); pybench grid packages/sparse-patterns/benchmarks/bench_grid.py -k 'test_grid_vs_dense and ours'"
python3 scripts/bench_summary.py $OUT/grid.json
timeout 200 python3 apps/vlm-accel/benchmarks/bench_ttft.py --lengths 128K --exact-verticals --out $OUT/ttft-128k.json 2>&1 | tail -4
