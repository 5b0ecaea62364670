source scripts/gpu_env.sh
export PYTHONPATH=$SRC_PATH${PYTHONPATH:-}
source <(sed -n '/^pybench()/,/^}/p' scripts/gpu_session.sh)
nvidia-smi --query-gpu=name --format=csv,noheader
SPARSE_KERNELS_AUTOTUNE=0 timeout 120 python3 -m pytest -q -p no:cacheprovider -n 12 -m "not slow" \
  packages/sparse-kernels/tests/test_estimate.py packages/sparse-patterns/tests/test_estimate.py \
  packages/sparse-patterns/tests/test_plan.py > $OUT/gpu-tests.log 2>&1; echo "tests rc=$?"; tail -2 $OUT/gpu-tests.log
timeout 100 python3 -m pytest -q -p no:cacheprovider packages/sparse-kernels/tests/test_estimate.py -k every_lines_config > $OUT/gpu-tests-configs.log 2>&1; echo "configs rc=$?"; tail -1 $OUT/gpu-tests-configs.log
for S in 131072 524288; do timeout 60 python3 scripts/profile_estimation.py --seq $S --rows 12 > $OUT/profile-$S.txt 2>&1; grep -E "plan_layer|_lines_kernel|_lse_kernel|Self CUDA time total" $OUT/profile-$S.txt | cut -c1-60,100-170; done
timeout 300 bash -c "$(declare -f pybench); pybench bnd packages/sparse-patterns/benchmarks/bench_grid.py -k 'test_boundary_overhead or (test_grid_vs_dense and ours and (512K or 1M))'"
python3 scripts/bench_summary.py $OUT/bnd.json
