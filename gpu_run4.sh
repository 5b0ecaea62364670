source scripts/gpu_env.sh
export PYTHONPATH=$SRC_PATH${PYTHONPATH:-}
source <(sed -n '/^pybench()/,/^}/p' scripts/gpu_session.sh)
nvidia-smi --query-gpu=name --format=csv,noheader
F=packages/triangle-mix/benchmarks/bench_trianglemix.py
ids=""
for L in 32K 64K 128K; do for m in dense trianglemix bs+trianglemix; do ids="$ids $F::test_prefill_ttft[$L-$m]"; done; done
timeout 560 bash -c "$(declare -f pybench); pybench tmbs $ids"
python3 - <<'PY'
import json, os
d = json.load(open(os.environ["OUT"] + "/tmbs.json"))
for b in d["benchmarks"]:
    x = b["extra_info"]
    print(b["name"], round(b["stats"]["median"], 3), {k: x.get(k) for k in ("block_density_last_dynamic_layer", "peak_mem_gib")})
PY
