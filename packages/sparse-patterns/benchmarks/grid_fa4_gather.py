"""Can FlashAttention-4 run the Grid head's permuted plan? Gather -> FA4 block-sparse -> scatter,
against the permuted Triton kernel on the same plan, in one process.

The permuted kernel reads q, k, v through the plan's permutations and masks by original position.
FA4 cannot gather rows, so here the permutation is made outside it:

1. q, k and v are gathered into permuted copies ``[H, S, D]`` (one Triton row-gather kernel each;
   k and v per query head, since each head has its own permutation);
2. each listed tile is classified: every pair visible (the largest original key position of the
   key block is at most the smallest original query position of the query block) goes to FA4's
   full list, the rest to its partial list;
3. FA4's block-sparse kernel runs with a CuTe ``mask_mod`` that reads both permutations as aux
   tensors and keeps ``kv_perm[c] <= q_perm[r]`` (the causal rule on original positions) in the
   partial tiles;
4. out and lse are gathered back to original row order through the inverse query permutation.

Recorded: the outputs against the permuted kernel's, each step's time, FA4's kernel alone (also
with every tile as a full block, to price the ``mask_mod``), and rates per listed tile over FA4's
dense causal rate as in ``grid_engine_bound.py``. Each call is timed in two rounds (a CUDA-event
median each); rates and ratios use the faster round.
Needs ``sparse-kernels[hopper]`` and an sm90 GPU.

    python packages/sparse-patterns/benchmarks/grid_fa4_gather.py --json gather.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import cutlass
import cutlass.cute as cute
import torch
import triton
import triton.language as tl
from flash_attn.cute import flash_attn_func
from flash_attn.cute import utils as fa4_utils
from flash_attn.cute.block_sparsity import BlockSparseTensorsTorch
from sparse_kernels.benchmark_providers import fa4_dense_anchor
from sparse_kernels.benchmarking import cuda_time_ms, env_info
from sparse_patterns import plan_layer

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_grid as bg  # noqa: E402 (the suite's inputs and plan, from beside this file)


@cute.jit
def _causal_on_original_positions(batch, head, q_idx, kv_idx, seqlen_info, aux_tensors):
    q_pos = aux_tensors[0][batch[0], head[0], q_idx[0]]
    kv_pos = aux_tensors[1][batch[0], head[0], kv_idx[0]]
    return fa4_utils.scalar_to_ssa(kv_pos, cutlass.Int32) <= fa4_utils.scalar_to_ssa(
        q_pos, cutlass.Int32
    )


@triton.jit
def _gather_rows_kernel(
    src, perm, dst, S, GROUP, s_src_h, s_src_s, s_perm_h, s_dst_h, s_dst_s,
    D: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    h = tl.program_id(1)
    rows = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = rows < S
    src_rows = tl.load(perm + h.to(tl.int64) * s_perm_h + rows, mask=ok, other=0).to(tl.int64)
    cols = tl.arange(0, D)
    x = tl.load(
        src + (h // GROUP).to(tl.int64) * s_src_h + src_rows[:, None] * s_src_s + cols[None, :],
        mask=ok[:, None],
    )
    dst_rows = rows[:, None].to(tl.int64) * s_dst_s
    tl.store(dst + h.to(tl.int64) * s_dst_h + dst_rows + cols[None, :], x, mask=ok[:, None])


def gather_rows(src: torch.Tensor, perm: torch.Tensor) -> torch.Tensor:
    """``dst[h, r] = src[h // G, perm[h, r]]``: ``src [H_src, S, D]`` (rows contiguous), ``perm``
    int32 ``[H, S]``, ``G = H / H_src``."""
    H_src, S, D = src.shape
    H = perm.shape[0]
    dst = torch.empty((H, S, D), dtype=src.dtype, device=src.device)
    _gather_rows_kernel[(triton.cdiv(S, 64), H)](
        src, perm, dst, S, H // H_src, src.stride(0), src.stride(1), perm.stride(0),
        dst.stride(0), dst.stride(1), D=D, BLOCK=64, num_warps=4,
    )  # fmt: skip
    return dst


def split_full_tiles(plan):
    """The plan's listed tiles as FA4's ``(partial count, partial list, full count, full list)``:
    a tile is full when every key of its key block precedes every query of its query block in
    original positions."""
    idx, cnt, block = plan.kv_block_indices, plan.kv_block_counts, plan.block
    B, H, S = plan.q_perm.shape
    q_min = plan.q_perm.view(B, H, S // block, block).amin(-1)
    kv_max = plan.kv_perm.view(B, H, S // block, block).amax(-1)
    listed = torch.arange(idx.shape[-1], device=idx.device) < cnt[..., None]
    tile_kv_max = torch.gather(kv_max, 2, idx.long().reshape(B, H, -1)).view(idx.shape)
    full = listed & (tile_kv_max <= q_min[..., None])

    def compact(sel):
        order = torch.argsort((~sel).to(torch.int8), dim=-1, stable=True)
        count = sel.sum(-1, dtype=torch.int32)
        return count, torch.gather(idx, -1, order)[..., : S // block].to(torch.int32).contiguous()

    return (*compact(listed & ~full), *compact(full))


def fa4_call(qp, kp, vp, tensors, plan, scale, mask=True):
    """FA4 on the gathered ``[H, S, D]`` copies; ``[1, S, H, D]`` out and ``[1, H, S]`` lse."""
    bshd = [t[None].transpose(1, 2) for t in (qp, kp, vp)]
    with torch.no_grad():
        if not mask:
            return flash_attn_func(
                *bshd, softmax_scale=scale, causal=False, block_sparse_tensors=tensors,
                return_lse=True,
            )  # fmt: skip
        return flash_attn_func(
            *bshd, softmax_scale=scale, causal=False, mask_mod=_causal_on_original_positions,
            block_sparse_tensors=tensors, aux_tensors=[plan.q_perm, plan.kv_perm], return_lse=True,
        )  # fmt: skip


def grid_through_fa4(q, k, v, plan, q_perm_inv, lists=None):
    """Steps 1-4 for ``B = 1``: out ``[1, H, S, D]`` and lse ``[1, H, S]`` in original order."""
    qp = gather_rows(q[0], plan.q_perm[0])
    kp = gather_rows(k[0], plan.kv_perm[0])
    vp = gather_rows(v[0], plan.kv_perm[0])
    pn, pi, fn, fi = split_full_tiles(plan) if lists is None else lists
    tensors = BlockSparseTensorsTorch(
        mask_block_cnt=pn, mask_block_idx=pi, full_block_cnt=fn, full_block_idx=fi,
        block_size=(plan.block, plan.block),
    )  # fmt: skip
    o, lse = fa4_call(qp, kp, vp, tensors, plan, q.shape[-1] ** -0.5)
    out = gather_rows(o[0].transpose(0, 1), q_perm_inv)[None]
    return out, torch.gather(lse[0], -1, q_perm_inv.long())[None], (qp, kp, vp, tensors)


def measure(S: int, rep: int) -> dict:
    q, k, v = (t.to(torch.bfloat16) for t in bg.planted_video_qkv(
        S, heads=bg.H, kv_heads=bg.H_KV, dim=bg.D, tpf=bg.TPF, device="cuda"
    ))  # fmt: skip
    plan = plan_layer(q, k, [bg.GRID] * bg.H, bg._layout(S), block=bg.BLOCK)
    if q.shape[0] != 1 or plan.q_perm is None:
        raise ValueError(f"expected B=1 and a permuted plan, got B={q.shape[0]}")
    S_ = plan.q_perm.shape[-1]
    q_perm_inv = torch.empty_like(plan.q_perm[0]).scatter_(
        -1, plan.q_perm[0].long(),
        torch.arange(S_, dtype=torch.int32, device="cuda").expand(bg.H, S_).contiguous(),
    )  # fmt: skip
    lists = split_full_tiles(plan)
    ref = plan.run(q, k, v)
    out, lse, (qp, kp, vp, tensors) = grid_through_fa4(q, k, v, plan, q_perm_inv, lists)
    finite = torch.isfinite(ref.lse)
    r = {
        "S": S,
        "listed_tiles": int(plan.kv_block_counts.sum()),
        "full_tiles": int(lists[2].sum()),
        "partial_tiles": int(lists[0].sum()),
        "max_abs_diff_out_vs_permuted_kernel": (out.float() - ref.out.float()).abs().max().item(),
        "max_abs_diff_lse": (lse[finite] - ref.lse[finite]).abs().max().item(),
        "same_empty_rows": bool(torch.equal(torch.isinf(lse), torch.isinf(ref.lse))),
    }
    del out, lse, ref
    every_tile_full = BlockSparseTensorsTorch(
        mask_block_cnt=torch.zeros_like(plan.kv_block_counts),
        mask_block_idx=plan.kv_block_indices[..., : S // bg.BLOCK].contiguous(),
        full_block_cnt=plan.kv_block_counts,
        full_block_idx=plan.kv_block_indices[..., : S // bg.BLOCK].contiguous(),
        block_size=(bg.BLOCK, bg.BLOCK),
    )
    scale = bg.D**-0.5
    calls = {
        "permuted_kernel": lambda: plan.run(q, k, v),
        "fa4_path_total": lambda: grid_through_fa4(q, k, v, plan, q_perm_inv),
        "gather_qkv": lambda: [gather_rows(t[0], p[0]) for t, p in
                               ((q, plan.q_perm), (k, plan.kv_perm), (v, plan.kv_perm))],
        "split_full_tiles": lambda: split_full_tiles(plan),
        "fa4_kernel": lambda: fa4_call(qp, kp, vp, tensors, plan, scale),
        "fa4_kernel_every_tile_full_no_mask": lambda: fa4_call(
            qp, kp, vp, every_tile_full, plan, scale, mask=False
        ),
    }  # fmt: skip
    anchor = fa4_dense_anchor(q, k, v, rep=3)
    r["fa4_dense_ms"] = anchor.median_ms
    frac = r["listed_tiles"] / (bg.H * (S // bg.BLOCK) * (S // bg.BLOCK + 1) / 2)
    for _ in range(2):
        for name, fn in calls.items():
            r.setdefault(f"{name}_ms", []).append(cuda_time_ms(fn, warmup=2, rep=rep))
    for name in ("permuted_kernel", "fa4_path_total", "fa4_kernel"):
        r[f"{name}_rate_per_tile_over_fa4_dense"] = anchor.median_ms * frac / min(r[f"{name}_ms"])
    r["fa4_path_over_permuted_kernel"] = min(r["permuted_kernel_ms"]) / min(r["fa4_path_total_ms"])
    return r


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--json", default="grid_fa4_gather.json")
    p.add_argument("--seqs", default="131072,524288")
    args = p.parse_args(argv)
    res = {"env": env_info()}
    for S in map(int, args.seqs.split(",")):
        res[str(S)] = measure(S, rep=10 if S <= 131072 else 4)
        print(json.dumps(res[str(S)]), flush=True)
        torch.cuda.empty_cache()
    with open(args.json, "w") as f:
        json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
