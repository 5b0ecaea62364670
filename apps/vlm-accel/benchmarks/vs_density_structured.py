"""How many blocks the estimated Vertical-Slash heads of ``bench_ttft.py`` cover on video tokens,
with plain random weights and with a shared query/key bias that makes attention local (CPU).

``bench_ttft.py`` times a fixed head mix (per KV group of 7 heads: 4 Grid, 2 Vertical-Slash,
1 A-shape) on random weights. Its Vertical-Slash heads come out nearly dense, and this script
checks whether that is an artefact of structureless random attention. It builds one decoder layer
of the same Qwen2.5-VL-7B shape (fp32, CPU), feeds random video embeddings with the benchmark's
M-RoPE positions and layout, and runs ``sparse_patterns.plan_layer`` on the layer's real q/k.
``--qk-bias-norm N`` gives every KV head a shared query/key bias of L2 norm N (its query heads get
the same vector). After RoPE, ``q_m . k_n`` then gains ``sum_i |c_i|^2 cos(theta_i (pos_m - pos_n))``,
which peaks at small relative 3-D positions, the locality of real heads. The estimators still
choose freely from the computed scores. Printed: the planned block density per head (listed
blocks / causal blocks, 64-token blocks) and the mean per pattern kind.

    python apps/vlm-accel/benchmarks/vs_density_structured.py --tokens 16384 --qk-bias-norm 0,16
"""

from __future__ import annotations

import argparse
import importlib.util
import json
from pathlib import Path

import torch


def _bench_ttft():
    path = Path(__file__).with_name("bench_ttft.py")
    spec = importlib.util.spec_from_file_location("bench_ttft", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def densities(tokens: int, norms: list[float], threads: int, smoke: bool = False) -> list[dict]:
    from sparse_patterns import plan_layer
    from triangle_mix import LayerPolicy
    from triangle_mix.integrations.hf import apply_triangle_mix

    bt = _bench_ttft()
    torch.set_num_threads(threads)
    dims = dict(bt.SMOKE if smoke else bt.FULL, layers=1)
    model = bt._model(dims, "cpu", torch.float32)
    embeds = torch.randn(1, tokens, dims["hidden"], generator=torch.Generator().manual_seed(0))
    pos = bt._positions(tokens, dims["tpf"], "cpu")
    layout = bt._layout(tokens, dims["tpf"], "cpu")
    # Exact columns: the Vertical-Slash block lists then hold their slash tiles only.
    heads = bt._head_mix(dims["heads"], dims["kv_heads"], dims["tpf"], exact_verticals=True)
    kinds = [type(h.pattern).__name__ for h in heads]
    rows = []
    for norm in norms:
        bt.structure_qk(model.layers[0], norm)
        got = {}

        def dynamic(q, k, v, *, layer_idx, scale, got=got):
            plan = plan_layer(q, k, heads, layout, scale=scale)
            nb = -(-tokens // plan.block)
            causal = nb * (nb + 1) / 2
            got["per_head"] = (plan.kv_block_counts[0].float().sum(-1) / causal).tolist()
            # The layer's output is not used: zeros of the right shape skip the attention itself.
            return torch.zeros_like(q)

        handle = apply_triangle_mix(model, LayerPolicy(("dynamic",)), dynamic=dynamic)
        try:
            with torch.no_grad():
                bt._prefill(model, embeds, pos, 8192)
        finally:
            handle.remove()
        mean = {
            kind: sum(d for d, kk in zip(got["per_head"], kinds) if kk == kind) / kinds.count(kind)
            for kind in sorted(set(kinds))
        }
        rows.append({"tokens": tokens, "qk_bias_norm": norm, "mean_density": mean,
                     "per_head": [round(d, 4) for d in got["per_head"]], "kinds": kinds})  # fmt: skip
        print(json.dumps({k: rows[-1][k] for k in ("tokens", "qk_bias_norm", "mean_density")}))
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tokens", type=int, default=16384)
    p.add_argument("--qk-bias-norm", default="0,16", help="comma-separated norms (0: no bias)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", default=None, help="write the rows as JSON here")
    p.add_argument("--smoke", action="store_true", help="bench_ttft's tiny shape (a dry run)")
    a = p.parse_args(argv)
    if a.tokens < 2048:
        p.error(f"--tokens: expected at least 2048, got {a.tokens}")
    norms = [float(x) for x in a.qk_bias_norm.split(",")]
    if any(n < 0 for n in norms):
        p.error(f"--qk-bias-norm: expected norms >= 0, got {a.qk_bias_norm}")
    rows = densities(a.tokens, norms, a.threads, smoke=a.smoke)
    if a.out:
        Path(a.out).write_text(json.dumps({"rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
