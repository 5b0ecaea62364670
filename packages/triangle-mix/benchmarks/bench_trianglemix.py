"""End-to-end prefill (TTFT) of a Llama-3.1-8B-shaped model (random bf16 weights) on one GPU:

- ``dense``: HF SDPA under the cuDNN backend in every layer;
- ``trianglemix``: dense below the start layer, triangle (sink 8, window 512, last 128) from it;
- ``vs+trianglemix``: the same, with MInference's Vertical-Slash (online estimation from the last
  64 queries, 1000 verticals, 6096 slashes; ``sparse_patterns.estimate_vertical_slash`` +
  ``sparse_kernels.vertical_slash_attention``) in the shallow layers instead of dense. Random
  weights have no attention structure: the estimated slashes scatter over all offsets, and
  after block rounding the pattern is nearly dense, so this is the pessimistic figure;
- ``vs-clustered+trianglemix``: the same estimation is run (its cost is paid), but the kernel
  gets the clustered index set of the vertical-slash kernel benchmark (1000 uniform verticals;
  the 64 local slashes plus runs of 64 adjacent offsets at log-uniform distances), the shape
  estimated slashes have on real models, so the timing reflects a real model's sparse layers.
- ``vs-local+trianglemix``: ``vs+trianglemix`` on the same weights with a shared query/key bias
  per KV head (norm ``QK_BIAS_NORM``, added to the q and k projections by forward hooks, before
  RoPE), which RoPE turns into local attention, as real heads mostly are. The estimator finds
  the structure itself (no injected indices); the dense layers cost the same with or without it.
- ``bs+trianglemix``: the shallow layers run the block-sparse dynamic pattern instead
  (``sparse_patterns.BlockSparse``: mean-pooled 64-blocks of q and k, top ``BS_TOP_K`` key blocks
  per query block, the first and the diagonal block always kept; ``plan_layer`` +
  ``BlockPlan.run``). Its budget is fixed in blocks, so unlike Vertical-Slash its cost does not
  depend on whether the weights give attention any structure. ``BS_TOP_K`` = 111 blocks is the
  nominal key budget of the Vertical-Slash rows (1000 + 6096 keys per query row, / 64). What it
  would cost in quality on a real 8B model is not measured here (random weights).
"""

from __future__ import annotations

import functools

import pytest
import torch
from sparse_kernels.benchmarking import env_info, run_benchmark
from torch.nn.attention import SDPBackend, sdpa_kernel
from triangle_mix import LayerPolicy

pytestmark = pytest.mark.gpu
transformers = pytest.importorskip("transformers")

LENGTHS = {"32K": 32768, "64K": 65536, "128K": 131072}
START = 16  # the paper's decline for Llama-3.1-8B is between layers 10 and 20
QK_BIAS_NORM = 16.0
BS_TOP_K = -(-(1000 + 6096) // 64)  # the Vertical-Slash rows' nominal keys per row, in blocks


@functools.cache
def _model():
    cfg = transformers.LlamaConfig(
        vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
        num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=131072 + 16,
        rope_theta=500000.0,
    )  # fmt: skip
    torch.manual_seed(0)
    prev = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        with torch.device("cuda"):
            model = transformers.LlamaForCausalLM(cfg).eval()
    finally:
        torch.set_default_dtype(prev)
    model.set_attn_implementation("sdpa")
    return model


def _prefill(model, ids):
    with torch.no_grad(), sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        return model(ids, use_cache=False, logits_to_keep=1).logits


def _vertical_slash_dynamic(clustered: bool = False):
    from sparse_kernels import vertical_slash_attention
    from sparse_kernels.benchmarking import clustered_vertical_slash_indices
    from sparse_patterns import VerticalSlash, estimate_vertical_slash

    pattern = VerticalSlash(n_vertical=1000, n_slash=6096)
    fixed = {}

    def dynamic(q, k, v, *, layer_idx, scale):
        vert, slash = estimate_vertical_slash(q, k, pattern, scale=scale)
        dynamic.last_slash = slash  # the estimate of the last dynamic layer, read after timing
        if clustered:
            B, H, S, _ = q.shape
            if S not in fixed:
                fixed.clear()
                fixed[S] = clustered_vertical_slash_indices(
                    B, H, S, vert.shape[-1], slash.shape[-1], device=q.device
                )
            vert, slash = fixed[S]
        return vertical_slash_attention(q, k, v, vert, slash, scale=scale).out

    return dynamic


def _block_sparse_dynamic():
    from sparse_patterns import BlockSparse, HeadConfig, plan_layer

    head = HeadConfig(BlockSparse(top_k=BS_TOP_K))

    def dynamic(q, k, v, *, layer_idx, scale):
        plan = plan_layer(q, k, head, None, block=64, scale=scale)
        dynamic.last_plan = plan  # the plan of the last dynamic layer, read after timing
        return plan.run(q, k, v, scale=scale).out

    return dynamic


def _local_qk_hooks(model) -> list:
    """Forward hooks adding one random direction of norm ``QK_BIAS_NORM`` per KV head to that
    head's keys and to the queries of its group (every layer its own directions, seeded)."""
    cfg = model.config
    D = cfg.hidden_size // cfg.num_attention_heads
    group = cfg.num_attention_heads // cfg.num_key_value_heads
    g = torch.Generator(device="cuda").manual_seed(1234)
    hooks = []
    for layer in model.model.layers:
        b = torch.randn(cfg.num_key_value_heads, D, device="cuda", generator=g)
        b = b / b.norm(dim=-1, keepdim=True) * QK_BIAS_NORM
        kb = b.reshape(-1).to(torch.bfloat16)
        qb = b.repeat_interleave(group, 0).reshape(-1).to(torch.bfloat16)
        attn = layer.self_attn
        hooks.append(attn.q_proj.register_forward_hook(lambda m, a, o, x=qb: o + x))
        hooks.append(attn.k_proj.register_forward_hook(lambda m, a, o, x=kb: o + x))
    return hooks


@pytest.mark.parametrize(
    "method",
    [
        "dense",
        "trianglemix",
        "vs+trianglemix",
        "vs-clustered+trianglemix",
        "vs-local+trianglemix",
        "bs+trianglemix",
    ],
)
@pytest.mark.parametrize("length", list(LENGTHS))
def test_prefill_ttft(benchmark, length, method):
    from triangle_mix.integrations.hf import apply_triangle_mix

    model = _model()
    S = LENGTHS[length]
    ids = torch.randint(
        0, 128256, (1, S), device="cuda", generator=torch.Generator("cuda").manual_seed(S)
    )
    handle = slash_info = bs_info = None
    hooks = _local_qk_hooks(model) if method == "vs-local+trianglemix" else []
    if method == "trianglemix":
        handle = apply_triangle_mix(model, LayerPolicy.triangle_from(32, START))
    elif method in ("vs+trianglemix", "vs-clustered+trianglemix", "vs-local+trianglemix"):
        policy = LayerPolicy.triangle_from(32, START, shallow="dynamic")
        dynamic = _vertical_slash_dynamic(clustered=method.startswith("vs-clustered"))
        handle = apply_triangle_mix(model, policy, dynamic=dynamic)
        slash_info = dynamic
    elif method == "bs+trianglemix":
        policy = LayerPolicy.triangle_from(32, START, shallow="dynamic")
        bs_info = _block_sparse_dynamic()
        handle = apply_triangle_mix(model, policy, dynamic=bs_info)
    try:
        logits = _prefill(model, ids)
        assert torch.isfinite(logits).all()
        torch.cuda.reset_peak_memory_stats()
        run_benchmark(benchmark, lambda: _prefill(model, ids), rounds=3, warmup_rounds=1)
    finally:
        if handle is not None:
            handle.remove()
        for hk in hooks:
            hk.remove()
    benchmark.extra_info.update(env_info())
    benchmark.extra_info.update(
        method=method, tokens=S, start_layer=START, median_s=benchmark.stats.stats.median,
        peak_mem_gib=torch.cuda.max_memory_allocated() / 2**30,
    )  # fmt: skip
    if bs_info is not None:  # the block density the plan of layer START - 1 ran
        benchmark.extra_info.update(
            block_sparse_top_k=BS_TOP_K,
            block_density_last_dynamic_layer=bs_info.last_plan.density(),
        )
    if slash_info is not None:  # where the estimator put the slashes (layer START - 1)
        off = slash_info.last_slash.float()
        benchmark.extra_info.update(
            estimated_slash_offset_median=off.median().item(),
            estimated_slash_frac_within_8192=(off < 8192).float().mean().item(),
        )
