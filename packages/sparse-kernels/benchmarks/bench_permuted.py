"""Permuted block-sparse attention, Qwen2.5-VL-7B head shape (H=28, H_KV=4, D=128), bf16, causal.

Two questions:

1. What do the index-driven gathers cost? The same kernel, the same block lists (same tiles
   computed), run un-permuted (contiguous loads), with a Grid permutation and with a random
   permutation, at 32K and 128K. Target: permuted within 1.2x of un-permuted.
2. A Grid head (stride = tokens per frame: 256, or 324 for 18 x 18 patches) at 128K / 512K / 1M
   vs cuDNN dense causal attention. After the Grid permutation every grid line is contiguous, so
   the Grid head's slash, vertical and horizontal lines become dense tiles (see ``_grid_lists``);
   causality is evaluated on original positions by the kernel.
"""

from __future__ import annotations

import functools

import pytest
import torch
import torch.nn.functional as F
from sparse_kernels import SparsePlan, grid_permutation, permuted_block_sparse_attention
from sparse_kernels.attention import masked_attention_reference
from sparse_kernels.benchmarking import attention_flops, causal_pairs, record, run_benchmark
from sparse_kernels.permuted import grid_line_offsets, inverse_permutation
from torch.nn.attention import SDPBackend, sdpa_kernel

pytestmark = pytest.mark.gpu

B, H, H_KV, D = 1, 28, 4, 128
BLOCK = 128
DENSITY = 0.05  # fraction of key blocks listed per query block in the gather-cost comparison
GATHER_SHAPES = {"qwen2.5-vl-7b-32K": 32768, "qwen2.5-vl-7b-128K": 131072}
GATHER_PROVIDERS = ["unpermuted", "grid-perm", "random-perm"]
GRID_SHAPES = {  # name: (S, stride)
    "qwen2.5-vl-7b-128K-stride256": (131072, 256),
    "qwen2.5-vl-7b-128K-stride324": (131072, 324),
    "qwen2.5-vl-7b-512K-stride256": (524288, 256),
    "qwen2.5-vl-7b-1M-stride256": (1048576, 256),
}
GRID_PROVIDERS = ["ours", "cudnn-dense"]


@functools.cache
def _inputs(S):
    g = torch.Generator(device="cuda").manual_seed(0)
    mk = lambda h: torch.randn(B, h, S, D, device="cuda", dtype=torch.bfloat16, generator=g)
    return mk(H), mk(H_KV), mk(H_KV)


def _random_lists(S, seed=0):
    nb = S // BLOCK
    n = max(1, int(DENSITY * nb))
    g = torch.Generator(device="cuda").manual_seed(seed)
    score = torch.rand(1, H, nb, nb, device="cuda", generator=g)
    idx = torch.topk(score, n, dim=-1).indices.to(torch.int32)  # n distinct blocks per row
    cnt = torch.full((1, H, nb), n, dtype=torch.int32, device="cuda")
    return idx, cnt


def _grid_lists(S, stride):
    """The Grid head of MMInference (Table 3: stride, hline, vline, slash all on, phase 0, shared
    by every head) as key-block lists in Grid-permuted order.

    Grid line ``c`` holds tokens ``i`` with ``i mod stride == c``; the permutation makes each line
    contiguous. Slash lines (``i - j`` a multiple of the stride) = key blocks sharing a line with
    the query block; the vertical line = key blocks holding line 0; the horizontal line = query
    blocks holding line 0 list every key block. Causality (original positions) is the kernel's.
    """
    nb = -(-S // BLOCK)
    offs = grid_line_offsets(S, stride, 0, device="cuda")[0]
    line = torch.searchsorted(offs, torch.arange(S, device="cuda"), right=True) - 1
    blk_lines = torch.zeros(nb, stride, device="cuda")
    blk_lines[torch.arange(S, device="cuda") // BLOCK, line] = 1.0
    listed = (blk_lines @ blk_lines.T) > 0  # slash
    has_line0 = blk_lines[:, 0] > 0
    listed |= has_line0[None, :]  # vertical line
    listed |= has_line0[:, None]  # horizontal line
    # Drop blocks with no causally visible pair: every original key of the key block lies after
    # every original query of the query block (the kernel would compute them only to mask them).
    perm = grid_permutation(S, stride, 0, device="cuda").perm[0].long()
    pad = torch.full((nb * BLOCK - S,), -1, device="cuda", dtype=torch.long)
    q_max = torch.cat([perm, pad]).view(nb, BLOCK).amax(-1)
    k_min = torch.cat([perm, pad.abs() * S]).view(nb, BLOCK).amin(-1)
    listed &= k_min[None, :] <= q_max[:, None]
    cnt = listed.sum(-1).to(torch.int32)
    idx = torch.topk(listed.to(torch.float32), int(cnt.max()), dim=-1).indices.to(torch.int32)
    return idx[None, None].contiguous(), cnt[None, None].contiguous()


def _check_rows(q, k, v, plan, out, heads=(0, 5), n_rows=256):
    """Reference for the last ``n_rows`` ORIGINAL rows of two heads (a full S x S mask would not
    fit): the listed permuted blocks of each row, mapped to original keys, causal."""
    S_Q, S_KV = q.shape[2], k.shape[2]
    group = H // H_KV
    rows = torch.arange(S_Q - n_rows, S_Q, device="cuda")
    worst = 0.0
    for h in heads:

        def perm_of(p, S, head):
            if p is None:
                return torch.arange(S, device="cuda")
            p = p.reshape(-1, S)
            return p[min(head, p.shape[0] - 1)].long()

        qp = perm_of(plan.q_perm, S_Q, h)
        kvp = plan.kv_perm
        kv_head = h if (kvp is not None and kvp.reshape(-1, S_KV).shape[0] == H) else h // group
        kp = perm_of(kvp, S_KV, kv_head)
        r = inverse_permutation(qp)[rows]
        idx, cnt = plan.kv_indices, plan.kv_num_blocks
        hi = min(h, idx.shape[1] - 1)
        lists = idx[0, hi, r // BLOCK].long()  # [n_rows, MAXB]
        valid = torch.arange(lists.shape[1], device="cuda") < cnt[0, hi, r // BLOCK, None]
        nkb = -(-S_KV // BLOCK)
        blk = torch.zeros(n_rows, nkb + 1, dtype=torch.bool, device="cuda")
        blk.scatter_(1, torch.where(valid, lists, nkb), True)
        c = inverse_permutation(kp)  # permuted column of each original key
        mask = blk[:, c // BLOCK]
        mask &= torch.arange(S_KV, device="cuda")[None, :] <= rows[:, None] + (S_KV - S_Q)
        ref = masked_attention_reference(
            q[:, h : h + 1, rows],
            k[:, h // group : h // group + 1],
            v[:, h // group : h // group + 1],
            mask[None, None],
            scale=D**-0.5,
            compute_dtype=torch.float32,
        ).out.float()
        got = out[:, h : h + 1, rows].float()
        worst = max(worst, ((got - ref).norm() / ref.norm()).item())
    assert worst < 2e-2, f"relative error {worst:.2e} on the checked rows"
    return worst


def _gather_plan(provider, S):
    idx, cnt = _random_lists(S)
    if provider == "unpermuted":
        q_perm = kv_perm = None
    elif provider == "grid-perm":
        # Every head its own phase; K/V permuted per query head (gathered, never copied).
        p = grid_permutation(S, 256, torch.arange(H, device="cuda") * 37 % 256).perm
        q_perm, kv_perm = p, p
    elif provider == "random-perm":
        g = torch.Generator(device="cuda").manual_seed(1)
        q_perm = torch.argsort(torch.rand(H, S, device="cuda", generator=g), -1).to(torch.int32)
        kv_perm = torch.argsort(torch.rand(H_KV, S, device="cuda", generator=g), -1)
        kv_perm = kv_perm.to(torch.int32)
    else:
        raise ValueError(provider)
    return SparsePlan(
        q_perm=q_perm,
        kv_perm=kv_perm,
        kv_indices=idx,
        kv_num_blocks=cnt,
        block_size=BLOCK,
        seq_lengths=(S, S),
        causal=True,
    )


@pytest.mark.parametrize("provider", GATHER_PROVIDERS)
@pytest.mark.parametrize("shape", list(GATHER_SHAPES))
def test_permuted_gather_cost(benchmark, shape, provider):
    S = GATHER_SHAPES[shape]
    q, k, v = _inputs(S)
    plan = _gather_plan(provider, S)  # contents checked here, once: the timed call is the kernel
    err = _check_rows(q, k, v, plan, permuted_block_sparse_attention(q, k, v, plan).out)
    fn = lambda: permuted_block_sparse_attention(q, k, v, plan).out
    torch.cuda.reset_peak_memory_stats()
    run_benchmark(benchmark, fn, rounds=10)
    tiles = int(plan.kv_num_blocks.sum()) * B
    record(
        benchmark,
        flops_dense=attention_flops(B, H, causal_pairs(S, S), D),
        flops_useful=attention_flops(1, 1, tiles * BLOCK * BLOCK, D),
        provider=provider,
        shape=shape,
        density=DENSITY,
        block=BLOCK,
        rel_err=err,
    )


@pytest.mark.parametrize("provider", GRID_PROVIDERS)
@pytest.mark.parametrize("shape", list(GRID_SHAPES))
def test_grid_head(benchmark, shape, provider):
    S, stride = GRID_SHAPES[shape]
    q, k, v = _inputs(S)
    err = float("nan")
    tiles = None
    if provider == "ours":
        p = grid_permutation(S, stride, 0, device="cuda").perm
        idx, cnt = _grid_lists(S, stride)
        plan = SparsePlan(
            q_perm=p,
            kv_perm=p,
            kv_indices=idx,
            kv_num_blocks=cnt,
            block_size=BLOCK,
            seq_lengths=(S, S),
            causal=True,
        )
        err = _check_rows(q, k, v, plan, permuted_block_sparse_attention(q, k, v, plan).out)
        fn = lambda: permuted_block_sparse_attention(q, k, v, plan).out
        tiles = int(cnt.sum()) * H
    elif provider == "cudnn-dense":
        rep = H // H_KV
        # cuDNN needs equal head counts here; the repeat is outside the timed call.
        kk, vv = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)

        def fn():
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                return F.scaled_dot_product_attention(q, kk, vv, is_causal=True)

    else:
        raise ValueError(provider)
    torch.cuda.reset_peak_memory_stats()
    # Dense at 512K / 1M takes seconds per call: fewer rounds there.
    rounds = 10 if (provider == "ours" or S <= 131072) else 2
    run_benchmark(benchmark, fn, rounds=rounds, warmup_rounds=1)
    dense = attention_flops(B, H, causal_pairs(S, S), D)
    useful = attention_flops(1, 1, tiles * BLOCK * BLOCK, D) if tiles is not None else dense
    record(
        benchmark,
        flops_dense=dense,
        flops_useful=useful,
        provider=provider,
        shape=shape,
        stride=stride,
        block=BLOCK,
        rel_err=err,
    )
