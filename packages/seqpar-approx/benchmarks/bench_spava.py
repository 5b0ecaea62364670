"""Spava vs baselines: prefill time of a Qwen2.5-VL-7B-shaped language model over H GPUs.

Run one command per host count (the lead's H200 machines), e.g.::

    torchrun --nproc-per-node 2 packages/seqpar-approx/benchmarks/bench_spava.py --out bench_spava_h2.json
    torchrun --nproc-per-node 4 packages/seqpar-approx/benchmarks/bench_spava.py --out bench_spava_h4.json

Modes (``--modes``, default all three):

* ``model``: 28-layer decoder with random bf16 weights (hidden 3584, H=28, H_KV=4, D=128, MLP
  18944, RoPE), one prefill of the whole prompt (``--query-len`` text tokens at the end). Methods:
  ``dense`` (1 GPU: rank 0 alone, the others wait), ``ring`` (exact ZigZag ring), ``star``,
  ``apb`` (no ZigZag, l_p = n/64), ``spava``, and the ablations ``spava-no-zigzag``,
  ``spava-no-overlap``, ``spava-no-fused`` (query rows projected in separate GEMMs), and Spava
  with sparse attention inside every host (``spava+trianglemix``, ``spava+mminference``,
  ``spava+mminference+trianglemix``; patterns and policy in ``spava_sparse.py``, or the
  MMInference heads of a pattern config with ``--config CFG``, e.g. a searched one; ``--block``
  sets their planner block, ``--prefix-blocks K`` makes their prefix keys block-sparse and
  ``--dense-rows N`` runs their segments of at most N rows dense; the prompt laid out as 64 text
  tokens, video frames of ``--tokens-per-frame`` tokens, the query). ``--fused-parts`` runs every
  method's RMSNorms, rotary step and MLP gate as the kernels of ``sparse_kernels.fused``. Each
  Spava method also records one extra (untimed) prefill split into sections per rank:
  attention, estimation, MLP, communication (``sections_per_rank``).
* ``attention``: one attention layer alone (same shapes), per method; the sparse methods run
  the step of layer ``--attention-layer`` (default: the last, a triangle layer under TriangleMix).
* ``vision``: Qwen2.5-VL-7B's vision tower (random weights) on ``--frames`` frames: every rank
  encodes all frames vs frame-parallel (Eq. 6 split + all-gather) — the ``frame_parallel`` ablation.
* ``attention`` mode also tries PyTorch's ``context_parallel`` (ring SDPA, K/V repeated to H
  heads); where it cannot run, the JSON entry says why (``skipped``). ``--no-torch-cp`` skips it.

Before timing, every method's distributed attention is checked at a small length against the
single-process simulation (spava/star/apb) or dense attention (ring); the errors go in the JSON.
Times are wall-clock per prefill, synchronised, TTFT = the slowest rank; median of ``--reps``.
``--smoke`` runs tiny shapes on CPU under gloo (to check the script, not to time anything).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from seqpar_approx import (
    DENSE,
    SectionTimer,
    SpavaConfig,
    layout_for,
    simulate_spava_attention,
    spava_attention,
    zigzag_ring_attention,
)
from seqpar_approx.faults import init_distributed
from seqpar_approx.timing import section
from sparse_kernels import attention, rms_norm, rotary, silu_mul
from spava_sparse import SPARSE_METHODS, sparsity, token_layout

MODEL_7B = dict(layers=28, hidden=3584, heads=28, kv_heads=4, head_dim=128, mlp=18944)
MODEL_SMOKE = dict(layers=2, hidden=128, heads=4, kv_heads=2, head_dim=32, mlp=256)
METHODS = [
    "dense",
    "ring",
    "star",
    "apb",
    "spava",
    "spava-no-zigzag",
    "spava-no-overlap",
    "spava-no-fused",
    *SPARSE_METHODS,
]


def method_setup(name: str, n: int, nq: int, H: int):
    """``(base method, layout, config, fused)`` of a benchmark method name."""
    base, fused, cfg = name, True, None
    if name.startswith("spava"):
        base = "spava"
        cfg = SpavaConfig(
            num_hosts=H,
            zigzag=name != "spava-no-zigzag",
            overlap_comm=name != "spava-no-overlap",
            fused_query=name != "spava-no-fused",
        )
        fused = cfg.fused_query
    layout, cfg = layout_for(base, n, query_len=nq, num_hosts=H, config=cfg)
    return base, layout, cfg, fused


def attn_fn(base, layout, cfg, step=DENSE, timer=None):
    if base == "dense":
        return lambda q, k, v: attention(q, k, v, causal=True).out
    if base == "ring":
        return lambda q, k, v: zigzag_ring_attention(q, k, v, layout).out
    return lambda q, k, v: (
        spava_attention(q, k, v, layout, cfg, host_attention=step, timer=timer).out
    )


def method_sparsity(args, name: str, m: dict):
    """The ``HostSparsity`` of a method under the command line's sparse-host options."""
    return sparsity(
        name, m, tokens_per_frame=args.tokens_per_frame, smoke=args.smoke,
        start_layer=args.start_layer, config=args.pattern_config, block=args.block,
        prefix_blocks=args.prefix_blocks, dense_rows=args.dense_rows,
    )  # fmt: skip


def layer_steps(args, name: str, m: dict, n: int, device) -> list:
    """Every layer's host attention step of a method (dense hosts unless sparse)."""
    sp = method_sparsity(args, name, m)
    if sp is None:
        return [DENSE] * m["layers"]
    lay = None
    if sp.patterns is not None:
        lay = token_layout(n, args.query_len, tokens_per_frame=args.tokens_per_frame, device=device)
    return [sp.for_layer(i, lay) for i in range(m["layers"])]


# ---- a Qwen2-shaped decoder layer ---------------------------------------------------------------


class RMSNorm(nn.Module):
    def __init__(self, d, eps=1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))
        self.eps = eps

    def forward(self, x):
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)).to(
            x.dtype
        ) * self.weight


class Layer(nn.Module):
    def __init__(self, m):
        super().__init__()
        d, hd = m["hidden"], m["head_dim"]
        self.m = m
        self.n1, self.n2 = RMSNorm(d), RMSNorm(d)
        self.q = nn.Linear(d, m["heads"] * hd, bias=True)
        self.k = nn.Linear(d, m["kv_heads"] * hd, bias=True)
        self.v = nn.Linear(d, m["kv_heads"] * hd, bias=True)
        self.o = nn.Linear(m["heads"] * hd, d, bias=False)
        self.gate = nn.Linear(d, m["mlp"], bias=False)
        self.up = nn.Linear(d, m["mlp"], bias=False)
        self.down = nn.Linear(m["mlp"], d, bias=False)


def _linear(lin, x, split):
    """One GEMM (fused) or two (context rows, then query rows: the unfused ablation)."""
    if split is None:
        return lin(x)
    return torch.cat([lin(x[:-split]), lin(x[-split:])])


def _rope(x, cos, sin):
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2 :]
    return x * cos + torch.cat([-x2, x1], dim=-1) * sin


class EagerParts:
    """The per-token steps of the layer in eager PyTorch (as HF's modules run them)."""

    @staticmethod
    def norm(n: RMSNorm, x):
        return n(x)

    @staticmethod
    def rotary(q, k, cos, sin):
        return _rope(q, cos, sin), _rope(k, cos, sin)

    @staticmethod
    def gate(g, u):
        return F.silu(g) * u


class FusedParts:
    """The same steps as one kernel each (``sparse_kernels.fused``, ``--fused-parts``)."""

    @staticmethod
    def norm(n: RMSNorm, x):
        return rms_norm(x, n.weight, eps=n.eps)

    @staticmethod
    def rotary(q, k, cos, sin):
        return rotary(q, k, cos[:, 0], sin[:, 0])

    @staticmethod
    def gate(g, u):
        return silu_mul(g, u)


def layer_forward(layer, h, cos, sin, attn, split, mlp_chunk=16384, timer=None, parts=EagerParts):
    m = layer.m
    S = h.shape[0]
    x = parts.norm(layer.n1, h)
    q = _linear(layer.q, x, split).view(S, m["heads"], m["head_dim"]).transpose(0, 1)[None]
    k = _linear(layer.k, x, split).view(S, m["kv_heads"], m["head_dim"]).transpose(0, 1)[None]
    v = _linear(layer.v, x, split).view(S, m["kv_heads"], m["head_dim"]).transpose(0, 1)[None]
    q, k = parts.rotary(q, k, cos, sin)
    with section(timer, "attention"):
        a = attn(q, k, v)[0].transpose(0, 1).reshape(S, -1)
    h = h + _linear(layer.o, a, split)
    x = parts.norm(layer.n2, h)
    out = torch.empty_like(h)
    # the MLP in row chunks bounds the [rows, 18944] intermediates; with split the query rows
    # get their own GEMMs (unfused ablation)
    bounds = list(range(0, S - (split or 0), mlp_chunk)) + [S - (split or 0)]
    if split:
        bounds.append(S)
    with section(timer, "mlp"):
        for a0, a1 in zip(bounds[:-1], bounds[1:]):
            xc = x[a0:a1]
            out[a0:a1] = layer.down(parts.gate(layer.gate(xc), layer.up(xc)))
    return h + out


def rope_tables(pos, head_dim, device, dtype):
    inv = 1.0 / (1e6 ** (torch.arange(0, head_dim, 2, device=device).float() / head_dim))
    f = pos.to(device).float()[:, None] * inv[None]
    emb = torch.cat([f, f], dim=-1)
    return emb.cos().to(dtype)[None, None], emb.sin().to(dtype)[None, None]


# ---- timing --------------------------------------------------------------------------------------


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def timed(fn, *, device, warmup, reps, active=True):
    """Per-rep times of ``fn`` on this rank, then the slowest rank per rep (TTFT)."""
    for _ in range(warmup):
        if active:
            fn()
    mine = []
    for _ in range(reps):
        sync(device)
        dist.barrier()
        t0 = time.perf_counter()
        if active:
            fn()
        sync(device)
        mine.append(time.perf_counter() - t0 if active else 0.0)
    t = torch.tensor(mine, dtype=torch.float64, device=device)
    allt = [torch.zeros_like(t) for _ in range(dist.get_world_size())]
    dist.all_gather(allt, t)
    per_rank = [x.tolist() for x in allt]
    slowest = [max(r[i] for r in per_rank) for i in range(reps)]
    return statistics.median(slowest), [statistics.median(r) for r in per_rank]


# ---- modes ---------------------------------------------------------------------------------------


def check_methods(args, m, device, dtype, rank, H):
    """Distributed attention vs simulation / dense at a small length (bf16 on GPU)."""
    n, nq = args.check_len, args.query_len
    g = torch.Generator().manual_seed(0)
    full = [
        torch.randn(1, h, n, m["head_dim"], generator=g).to(device, dtype)
        for h in (m["heads"], m["kv_heads"], m["kv_heads"])
    ]
    dense = attention(*full, causal=True)
    res = []
    names = ["ring", "star", "apb", "spava", "spava-no-zigzag", "spava-no-overlap"]
    names += [x for x in SPARSE_METHODS if x in args.methods]
    for name in names:
        base, layout, cfg, _ = method_setup(name, n, nq, H)
        steps = layer_steps(args, name, m, n, device)
        # the first and the last layer: dense / MMInference below TriangleMix's start, triangle
        # from it
        for layer in sorted({0, m["layers"] - 1}) if name in SPARSE_METHODS else [0]:
            step = steps[layer]
            local = [layout.shard(t, rank, dim=2) for t in full]
            got = attn_fn(base, layout, cfg, step)(*local)
            if base == "ring":
                ref = dense.out
            else:
                ref = simulate_spava_attention(*full, layout, cfg, host_attention=step).out
            err = (got.float() - layout.shard(ref, rank, dim=2).float()).abs().max()
            dist.all_reduce(err, op=dist.ReduceOp.MAX)
            res.append({"method": name, "layer": layer, "check_len": n, "max_abs_err": err.item()})
    return res


def prefill_sections(run_with_timer, device) -> list[dict]:
    """One untimed prefill with a :class:`SectionTimer`: every rank's seconds per section."""
    timer = SectionTimer(device)
    run_with_timer(timer)
    sync(device)
    mine = timer.seconds()
    every = [None] * dist.get_world_size()
    dist.all_gather_object(every, mine)
    return every


def bench_model(args, m, device, dtype, rank, H, n):
    torch.manual_seed(0)
    with torch.device(device):  # initialise on the GPU: 6.5B fp32 parameters on CPU are slow
        layers = nn.ModuleList(Layer(m).to(dtype) for _ in range(m["layers"]))
    with torch.no_grad():
        for p in layers.parameters():
            if p.ndim == 2:
                p.normal_(std=0.02)
            else:
                p.zero_()
        for layer in layers:
            layer.n1.weight.fill_(1.0)
            layer.n2.weight.fill_(1.0)
    g = torch.Generator().manual_seed(1)
    emb = (torch.randn(n, m["hidden"], generator=g) * 0.5).to(device, dtype)
    parts = FusedParts if args.fused_parts else EagerParts
    out = []
    for name in args.methods:
        if name == "dense" and not args.dense_ok(n):
            continue
        base, layout, cfg, fused = method_setup(name, n, args.query_len, H)
        active = base != "dense" or rank == 0
        if base == "dense":
            h0, pos = emb, torch.arange(n)
        else:
            h0, pos = layout.shard(emb, rank, dim=0), layout.local_indices(rank)
        cos, sin = rope_tables(pos, m["head_dim"], device, dtype)
        steps = layer_steps(args, name, m, n, device)
        setup = (base, layout, cfg)
        split = None if fused or base != "spava" else args.query_len

        @torch.no_grad()
        def run(timer=None, h0=h0, cos=cos, sin=sin, steps=steps, split=split, how=setup):
            h = h0
            for layer, step in zip(layers, steps):
                attn = attn_fn(*how, step, timer)
                h = layer_forward(layer, h, cos, sin, attn, split, timer=timer, parts=parts)
            return h

        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats()
        ttft, per_rank = timed(
            run, device=device, warmup=args.warmup, reps=args.reps, active=active
        )
        peak = torch.cuda.max_memory_allocated() / 2**30 if device.type == "cuda" else None
        out.append(
            {
                "mode": "model",
                "method": name,
                "seq_len": n,
                "ttft_s": ttft,
                "per_rank_s": per_rank,
                "peak_mem_gib_rank": peak,
                "layers": m["layers"],
                "fused_parts": args.fused_parts,
            }
        )
        if base == "spava":
            out[-1]["sections_per_rank"] = prefill_sections(run, device)
        if rank == 0:
            print(
                f"model n={n} {name:18s} ttft {ttft:.3f}s per rank {[round(x, 3) for x in per_rank]}",
                flush=True,
            )
    return out


def bench_attention(args, m, device, dtype, rank, H, n):
    out = []
    g = torch.Generator().manual_seed(2)
    full = [
        torch.randn(1, h, n, m["head_dim"], generator=g).to(device, dtype)
        for h in (m["heads"], m["kv_heads"], m["kv_heads"])
    ]
    for name in args.methods:
        if name == "spava-no-fused" or (name == "dense" and not args.dense_ok(n)):
            continue
        base, layout, cfg, _ = method_setup(name, n, args.query_len, H)
        active = base != "dense" or rank == 0
        local = full if base == "dense" else [layout.shard(t, rank, dim=2) for t in full]
        step = layer_steps(args, name, m, n, device)[args.attention_layer]
        fn = attn_fn(base, layout, cfg, step)
        t, per_rank = timed(
            lambda fn=fn, local=local: fn(*local),
            device=device,
            warmup=args.warmup,
            reps=args.reps,
            active=active,
        )
        out.append(
            {"mode": "attention", "method": name, "seq_len": n, "time_s": t, "per_rank_s": per_rank}
        )
        if rank == 0:
            print(f"attention n={n} {name:18s} {t * 1e3:.2f} ms", flush=True)
    return out


def bench_torch_cp(args, m, device, dtype, rank, H, n):
    """PyTorch's own context parallel (ring SDPA over a device mesh), attention only; skipped
    with the reason in the JSON where it does not run (CPU, old torch, unsupported backend)."""
    entry = {"mode": "attention", "method": "torch-context-parallel", "seq_len": n}
    try:
        if device.type != "cuda":
            raise NotImplementedError("needs CUDA")
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor.experimental import context_parallel

        mesh = init_device_mesh("cuda", (H,))
        g = torch.Generator().manual_seed(2)
        q, k, v = [
            torch.randn(1, h, n, m["head_dim"], generator=g).to(device, dtype)
            for h in (m["heads"], m["kv_heads"], m["kv_heads"])
        ]
        rep = m["heads"] // m["kv_heads"]
        k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)

        def run():
            # context_parallel shards its buffers in place (and, with no_restore_buffers, leaves
            # them sharded): give it fresh full-length copies every call, or each repetition
            # would run on a shorter sequence than the last.
            qq, kk, vv = q.clone(), k.clone(), v.clone()
            with context_parallel(
                mesh,
                buffers=[qq, kk, vv],
                buffer_seq_dims=[2, 2, 2],
                no_restore_buffers={qq, kk, vv},
            ):
                return F.scaled_dot_product_attention(qq, kk, vv, is_causal=True)

        entry["time_s"], entry["per_rank_s"] = timed(
            run, device=device, warmup=args.warmup, reps=args.reps
        )
        entry["note"] = (
            "K/V repeated to H heads (GQA not sharded natively); includes cloning the full "
            "buffers and sharding them"
        )
    except Exception as e:  # noqa: BLE001 - recorded as skipped, never silently
        entry["skipped"] = f"{type(e).__name__}: {e}"[:500]
    if rank == 0:
        shown = f"{entry['time_s'] * 1e3:.2f} ms" if "time_s" in entry else entry.get("skipped")
        print(f"attention n={n} torch-context-parallel {shown}", flush=True)
    return [entry]


def bench_vision(args, device, dtype, rank, H):
    import types

    from seqpar_approx.integrations.hf import frame_parallel_visual
    from transformers import Qwen2_5_VLConfig
    from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import (
        Qwen2_5_VisionTransformerPretrainedModel,
    )

    if args.smoke:
        vc = dict(
            depth=2,
            hidden_size=32,
            num_heads=2,
            intermediate_size=64,
            out_hidden_size=64,
            window_size=56,
            fullatt_block_indexes=[1],
        )
    else:  # Qwen2.5-VL-7B's vision tower
        vc = dict(
            depth=32,
            hidden_size=1280,
            num_heads=16,
            intermediate_size=3420,
            out_hidden_size=3584,
            window_size=112,
            fullatt_block_indexes=[7, 15, 23, 31],
        )
    cfg = Qwen2_5_VLConfig(
        vision_config=dict(patch_size=14, spatial_merge_size=2, temporal_patch_size=2, **vc)
    )
    torch.manual_seed(0)
    vis = (
        Qwen2_5_VisionTransformerPretrainedModel._from_config(cfg.vision_config)
        .to(device, dtype)
        .eval()
    )
    t = args.frames // 2
    hw = args.frame_patches
    g = torch.Generator().manual_seed(3)
    pix = torch.randn(t * hw * hw, 3 * 2 * 14 * 14, generator=g).to(device, dtype)
    grid = torch.tensor([[t, hw, hw]], device=device)
    holder = types.SimpleNamespace(model=types.SimpleNamespace(visual=vis))
    out = []
    for name, fp in (("all-frames-per-rank", False), ("frame-parallel", True)):
        handle = frame_parallel_visual(holder, None) if fp else None

        @torch.no_grad()
        def run():
            return vis(pix, grid_thw=grid)

        tt, per_rank = timed(run, device=device, warmup=args.warmup, reps=args.reps)
        if handle is not None:
            handle.remove()
        out.append(
            {
                "mode": "vision",
                "method": name,
                "frames": args.frames,
                "patches_per_frame": hw * hw,
                "time_s": tt,
                "per_rank_s": per_rank,
            }
        )
        if rank == 0:
            print(f"vision {args.frames} frames {name:22s} {tt:.3f}s", flush=True)
    return out


def mminference_hosts(args, m: dict) -> dict | None:
    """The planner block, prefix blocks and dense rows of the MMInference hosts, as built (None
    when no method runs them)."""
    name = next((x for x in args.methods if "mminference" in x), None)
    if name is None:
        return None
    sp = method_sparsity(args, name, m)
    top_k = None if sp.prefix is None else sp.prefix.top_k
    return {"block": sp.block, "prefix_blocks": top_k, "dense_rows": sp.dense_rows}


def load_config(p: argparse.ArgumentParser, path: str, m: dict):
    """``--config``: a ``PatternConfig`` of ``m``'s layers and heads, or a usage error (exit 2)
    naming what was expected and what the file holds."""
    from sparse_patterns import PatternConfig

    try:
        cfg = PatternConfig.load(path)
    except (OSError, ValueError, TypeError) as e:  # UnicodeDecodeError is a ValueError
        p.error(f"--config: expected a readable pattern config JSON, got {path!r} ({e})")
    got, want = (cfg.num_layers, cfg.num_heads), (m["layers"], m["heads"])
    if got != want:
        p.error(f"--config: expected (layers, heads) = {want} of the model, got {got} in {path}")
    return cfg


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--seq-lens", default="65536,131072,262144")
    p.add_argument("--methods", default=",".join(METHODS))
    p.add_argument("--modes", default="model,attention,vision")
    p.add_argument("--layers", type=int, default=None, help="override the 28 layers (quicker runs)")
    p.add_argument("--query-len", type=int, default=128)
    p.add_argument("--check-len", type=int, default=8192)
    p.add_argument("--max-dense-len", type=int, default=262144, help="skip 1-GPU dense above this")
    p.add_argument("--frames", type=int, default=64)
    p.add_argument("--frame-patches", type=int, default=36, help="patches per frame side (504 px)")
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--out", default="bench_spava.json")
    p.add_argument("--no-torch-cp", action="store_true", help="skip PyTorch's context_parallel")
    p.add_argument("--tokens-per-frame", type=int, default=None, help="256 (smoke: 16)")
    p.add_argument("--start-layer", type=int, default=None, help="TriangleMix (default: L/2)")
    p.add_argument("--attention-layer", type=int, default=-1, help="sparse step in attention mode")
    p.add_argument(
        "--config",
        metavar="CFG",
        help="pattern config JSON of the MMInference hosts' heads (e.g. from the offline search), "
        "of the model's layers and heads; default: the fixed mix of spava_sparse.py",
    )
    p.add_argument(
        "--block",
        type=int,
        choices=(64, 128),
        default=None,
        help="the MMInference hosts' planner block (default 64; smoke: 16)",
    )
    p.add_argument(
        "--prefix-blocks",
        type=int,
        metavar="K",
        default=None,
        help="the MMInference hosts attend K blocks of 64 prefix keys per head, chosen by "
        "seqpar_approx.PrefixBlocks (default: every prefix key)",
    )
    p.add_argument(
        "--dense-rows",
        type=int,
        metavar="N",
        default=0,
        help="the MMInference hosts attend segments of at most N rows (e.g. the anchor) densely, "
        "unplanned (default 0: only those of one block)",
    )
    p.add_argument(
        "--fused-parts",
        action="store_true",
        help="model mode: every method's RMSNorms, rotary step and MLP gate run as one kernel "
        "each (sparse_kernels.fused) instead of eager PyTorch",
    )
    p.add_argument("--smoke", action="store_true", help="tiny CPU/gloo run to test the script")
    args = p.parse_args(argv)
    if args.dense_rows < 0:
        p.error(f"--dense-rows: expected an int >= 0, got {args.dense_rows}")
    if args.prefix_blocks is not None and args.prefix_blocks < 1:
        p.error(f"--prefix-blocks: expected an int >= 1, got {args.prefix_blocks}")
    args.methods = [s for s in args.methods.split(",") if s]
    bad = [s for s in args.methods if s not in METHODS]
    if bad:
        p.error(f"--methods: unknown {bad}, expected a subset of {METHODS}")
    mm = [x for x in args.methods if "mminference" in x]
    for flag, val in (("--prefix-blocks", args.prefix_blocks), ("--dense-rows", args.dense_rows)):
        if val and not mm:
            got = ",".join(args.methods)
            p.error(f"{flag}: expected a spava+mminference method in --methods, got {got}")
    args.dense_ok = lambda n: n <= args.max_dense_len
    m = dict(MODEL_SMOKE if args.smoke else MODEL_7B)
    if args.layers:
        m["layers"] = args.layers
    args.pattern_config = None if args.config is None else load_config(p, args.config, m)
    # --smoke is a CPU/gloo dry run wherever it runs (a GPU machine with fewer GPUs than ranks too).
    on_gpu = torch.cuda.is_available() and not args.smoke
    rank, H = init_distributed(timeout_s=1800, backend=None if on_gpu else "gloo")
    if not dist.is_initialized():
        p.error("run under torchrun (e.g. torchrun --nproc-per-node 2 bench_spava.py)")
    device = torch.device(f"cuda:{torch.cuda.current_device()}" if on_gpu else "cpu")
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    if args.smoke:
        args.check_len = min(args.check_len, 512)
    if args.tokens_per_frame is None:
        args.tokens_per_frame = 16 if args.smoke else 256
    lens = [int(s) for s in args.seq_lens.split(",")]
    from sparse_kernels.benchmarking import env_info

    report = {
        "env": env_info(),
        "world_size": H,
        "model": m,
        "dtype": str(dtype),
        "query_len": args.query_len,
        "head_config": "fixed mix (spava_sparse.py)" if args.config is None else args.config,
        "mminference_hosts": mminference_hosts(args, m),
        "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
        "results": [],
    }
    report["checks"] = check_methods(args, m, device, dtype, rank, H)
    if rank == 0:
        print("checks:", report["checks"], flush=True)
    modes = args.modes.split(",")
    for n in lens:
        if "attention" in modes:
            report["results"] += bench_attention(args, m, device, dtype, rank, H, n)
            if not args.no_torch_cp:
                report["results"] += bench_torch_cp(args, m, device, dtype, rank, H, n)
        if "model" in modes:
            report["results"] += bench_model(args, m, device, dtype, rank, H, n)
            if device.type == "cuda":
                torch.cuda.empty_cache()
    if "vision" in modes:
        report["results"] += bench_vision(args, device, dtype, rank, H)
    # speedups against the 1-GPU dense prefill of the same run
    dense = {
        (r["mode"], r["seq_len"]): r.get("ttft_s", r.get("time_s"))
        for r in report["results"]
        if r["method"] == "dense"
    }
    for r in report["results"]:
        base = dense.get((r["mode"], r.get("seq_len")))
        if base and ("ttft_s" in r or "time_s" in r):
            r["speedup_vs_dense"] = base / r.get("ttft_s", r.get("time_s"))
    if rank == 0:
        with open(args.out, "w") as f:
            json.dump(report, f, indent=1)
        print(f"wrote {os.path.abspath(args.out)}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
