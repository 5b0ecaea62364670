"""Probe: the order in which the block-sparse kernel's programs run, on one GPU, one process.

A copy of the kernel's prologue with an ``ORDER`` switch, around the package's own list walk
(``_walk_list``): 0 takes query blocks in order, 1 last query blocks first (what the package's
kernel does), 2 reads its (head, query block) from a schedule sorted by list length, longest first
(LPT; "lpt_with_sort" includes the sort, "lpt_sched_given" reuses one); 3 and 4 are persistent
programs (one per SM for 128-row tiles, two for 64-row ones) walking the items of order 1, 3 by a
static round-robin split, 4 taking the next item from an atomic counter. Lists: the diagonal block
as the partial list and a random fraction of the causal 128x128 blocks per head as full ones
(uniform 10% / 30%, or per-head densities spread from 2% to 60%). Outputs are checked equal to
order 0, then each order is timed three times (CUDA-event medians, ms).

    python packages/sparse-kernels/benchmarks/block_sparse_order_probe.py order.json
"""

import json
import sys

import torch
import triton
import triton.language as tl
from sparse_kernels._triton.config import block_d
from sparse_kernels._triton.inner import _finish_rows
from sparse_kernels._triton.tma import kv_descriptors
from sparse_kernels.benchmark_providers import qwen_inputs
from sparse_kernels.benchmarking import cuda_time_ms, env_info
from sparse_kernels.block_sparse import triton as bst
from sparse_kernels.block_sparse.triton import _bcast_strides, _walk_list
from sparse_kernels.tuning import choose_config

DEV = "cuda"


@triton.jit
def _tile(
    bh, pid_m, q_ptr, k_ptr, v_ptr, out_ptr, lse_ptr, num_ptr, idx_ptr, fnum_ptr, fidx_ptr,
    k_desc, v_desc, sched_ptr, stride_q_b, stride_q_h, stride_q_s, stride_q_d, stride_k_b,
    stride_k_h, stride_k_s, stride_k_d, stride_v_b, stride_v_h, stride_v_s, stride_v_d,
    stride_o_b, stride_o_h, stride_o_s, stride_o_d, stride_n_b, stride_n_h, stride_n_m,
    stride_i_b, stride_i_h, stride_i_m, stride_fn_b, stride_fn_h, stride_fn_m, stride_fi_b,
    stride_fi_h, stride_fi_m, H, GROUP, S_Q, S_KV, NQB, sm_scale, D: tl.constexpr,
    BLOCK_D: tl.constexpr, IS_CAUSAL: tl.constexpr, IEEE: tl.constexpr, HAS_FULL: tl.constexpr,
    MASK_BM: tl.constexpr, MASK_BN: tl.constexpr, TILE_M: tl.constexpr, TILE_N: tl.constexpr,
    TMA: tl.constexpr,
):  # fmt: skip
    SUB: tl.constexpr = MASK_BM // TILE_M
    b = (bh // H).to(tl.int64)
    h = (bh % H).to(tl.int64)
    h_kv = h // GROUP
    mblk = (pid_m // SUB).to(tl.int64)
    row0 = pid_m * TILE_M
    offs_m = row0 + tl.arange(0, TILE_M)
    offs_n = tl.arange(0, TILE_N)
    offs_d = tl.arange(0, BLOCK_D)
    row_ok = offs_m < S_Q
    d_ok = offs_d < D
    q_ptrs = (
        q_ptr
        + b * stride_q_b
        + h * stride_q_h
        + offs_m[:, None].to(tl.int64) * stride_q_s
        + offs_d[None, :] * stride_q_d
    )
    q = tl.load(q_ptrs, mask=row_ok[:, None] & d_ok[None, :], other=0.0)
    k_base = k_ptr + b * stride_k_b + h_kv * stride_k_h
    v_base = v_ptr + b * stride_v_b + h_kv * stride_v_h
    qk_scale = sm_scale * 1.4426950408889634
    m_i = tl.full([TILE_M], float("-inf"), tl.float32)
    l_i = tl.zeros([TILE_M], tl.float32)
    acc = tl.zeros([TILE_M, BLOCK_D], tl.float32)
    q_pos = offs_m + (S_KV - S_Q)
    first_pos = row0 + (S_KV - S_Q)
    if HAS_FULL:
        n_full = tl.load(fnum_ptr + b * stride_fn_b + h * stride_fn_h + mblk * stride_fn_m)
        fidx_base = fidx_ptr + b * stride_fi_b + h * stride_fi_h + mblk * stride_fi_m
        acc, l_i, m_i = _walk_list(
            acc,
            l_i,
            m_i,
            q,
            k_base,
            v_base,
            fidx_base,
            n_full,
            stride_k_s,
            stride_k_d,
            stride_v_s,
            stride_v_d,
            q_pos,
            first_pos,
            offs_n,
            offs_d,
            S_KV,
            qk_scale,
            k_desc,
            v_desc,
            b,
            h_kv,
            D,
            BLOCK_D,
            MASK_BN,
            TILE_N,
            IS_CAUSAL,
            IEEE,
            TMA,
        )
    n_part = tl.load(num_ptr + b * stride_n_b + h * stride_n_h + mblk * stride_n_m)
    idx_base = idx_ptr + b * stride_i_b + h * stride_i_h + mblk * stride_i_m
    acc, l_i, m_i = _walk_list(
        acc,
        l_i,
        m_i,
        q,
        k_base,
        v_base,
        idx_base,
        n_part,
        stride_k_s,
        stride_k_d,
        stride_v_s,
        stride_v_d,
        q_pos,
        first_pos,
        offs_n,
        offs_d,
        S_KV,
        qk_scale,
        k_desc,
        v_desc,
        b,
        h_kv,
        D,
        BLOCK_D,
        MASK_BN,
        TILE_N,
        IS_CAUSAL,
        IEEE,
        TMA,
    )
    out, lse = _finish_rows(acc, l_i, m_i)
    o_ptrs = (
        out_ptr
        + b * stride_o_b
        + h * stride_o_h
        + offs_m[:, None].to(tl.int64) * stride_o_s
        + offs_d[None, :] * stride_o_d
    )
    tl.store(o_ptrs, out.to(out_ptr.dtype.element_ty), mask=row_ok[:, None] & d_ok[None, :])
    tl.store(lse_ptr + bh.to(tl.int64) * S_Q + offs_m, lse, mask=row_ok)


@triton.jit
def _kern(
    q_ptr, k_ptr, v_ptr, out_ptr, lse_ptr, num_ptr, idx_ptr, fnum_ptr, fidx_ptr, k_desc, v_desc,
    sched_ptr, stride_q_b, stride_q_h, stride_q_s, stride_q_d, stride_k_b, stride_k_h,
    stride_k_s, stride_k_d, stride_v_b, stride_v_h, stride_v_s, stride_v_d, stride_o_b,
    stride_o_h, stride_o_s, stride_o_d, stride_n_b, stride_n_h, stride_n_m, stride_i_b,
    stride_i_h, stride_i_m, stride_fn_b, stride_fn_h, stride_fn_m, stride_fi_b, stride_fi_h,
    stride_fi_m, H, GROUP, S_Q, S_KV, NQB, sm_scale, D: tl.constexpr, BLOCK_D: tl.constexpr,
    IS_CAUSAL: tl.constexpr, IEEE: tl.constexpr, HAS_FULL: tl.constexpr, MASK_BM: tl.constexpr,
    MASK_BN: tl.constexpr, TILE_M: tl.constexpr, TILE_N: tl.constexpr, TMA: tl.constexpr,
    ORDER: tl.constexpr, N_ITEMS,
):  # fmt: skip
    SUB: tl.constexpr = MASK_BM // TILE_M
    PER_HEAD = NQB * SUB
    if ORDER == 3:
        # Persistent, static: program p takes items p, p + P, ... (last query blocks first).
        for i in range(tl.program_id(0), N_ITEMS, tl.num_programs(0)):
            bh = i // PER_HEAD
            pid_m = PER_HEAD - 1 - i % PER_HEAD
            _tile(
                bh, pid_m, q_ptr, k_ptr, v_ptr, out_ptr, lse_ptr, num_ptr, idx_ptr,
                fnum_ptr, fidx_ptr, k_desc, v_desc, sched_ptr, stride_q_b, stride_q_h,
                stride_q_s, stride_q_d, stride_k_b, stride_k_h, stride_k_s, stride_k_d,
                stride_v_b, stride_v_h, stride_v_s, stride_v_d, stride_o_b, stride_o_h,
                stride_o_s, stride_o_d, stride_n_b, stride_n_h, stride_n_m, stride_i_b,
                stride_i_h, stride_i_m, stride_fn_b, stride_fn_h, stride_fn_m, stride_fi_b,
                stride_fi_h, stride_fi_m, H, GROUP, S_Q, S_KV, NQB, sm_scale, D, BLOCK_D,
                IS_CAUSAL, IEEE, HAS_FULL, MASK_BM, MASK_BN, TILE_M, TILE_N, TMA,
            )  # fmt: skip
    elif ORDER == 4:
        # Persistent, dynamic: each program takes the next item from a counter.
        i = tl.atomic_add(sched_ptr, 1)
        while i < N_ITEMS:
            bh = i // PER_HEAD
            pid_m = PER_HEAD - 1 - i % PER_HEAD
            _tile(
                bh, pid_m, q_ptr, k_ptr, v_ptr, out_ptr, lse_ptr, num_ptr, idx_ptr,
                fnum_ptr, fidx_ptr, k_desc, v_desc, sched_ptr, stride_q_b, stride_q_h,
                stride_q_s, stride_q_d, stride_k_b, stride_k_h, stride_k_s, stride_k_d,
                stride_v_b, stride_v_h, stride_v_s, stride_v_d, stride_o_b, stride_o_h,
                stride_o_s, stride_o_d, stride_n_b, stride_n_h, stride_n_m, stride_i_b,
                stride_i_h, stride_i_m, stride_fn_b, stride_fn_h, stride_fn_m, stride_fi_b,
                stride_fi_h, stride_fi_m, H, GROUP, S_Q, S_KV, NQB, sm_scale, D, BLOCK_D,
                IS_CAUSAL, IEEE, HAS_FULL, MASK_BM, MASK_BN, TILE_M, TILE_N, TMA,
            )  # fmt: skip
            i = tl.atomic_add(sched_ptr, 1)
    else:
        if ORDER == 2:
            pid = tl.program_id(0)
            item = tl.load(sched_ptr + pid // SUB)
            bh = item // NQB
            pid_m = (item % NQB) * SUB + pid % SUB
        elif ORDER == 1:
            pid_m = tl.num_programs(0) - 1 - tl.program_id(0)
            bh = tl.program_id(1)
        else:
            pid_m = tl.program_id(0)
            bh = tl.program_id(1)
        _tile(
            bh, pid_m, q_ptr, k_ptr, v_ptr, out_ptr, lse_ptr, num_ptr, idx_ptr, fnum_ptr,
            fidx_ptr, k_desc, v_desc, sched_ptr, stride_q_b, stride_q_h, stride_q_s,
            stride_q_d, stride_k_b, stride_k_h, stride_k_s, stride_k_d, stride_v_b,
            stride_v_h, stride_v_s, stride_v_d, stride_o_b, stride_o_h, stride_o_s,
            stride_o_d, stride_n_b, stride_n_h, stride_n_m, stride_i_b, stride_i_h,
            stride_i_m, stride_fn_b, stride_fn_h, stride_fn_m, stride_fi_b, stride_fi_h,
            stride_fi_m, H, GROUP, S_Q, S_KV, NQB, sm_scale, D, BLOCK_D, IS_CAUSAL, IEEE,
            HAS_FULL, MASK_BM, MASK_BN, TILE_M, TILE_N, TMA,
        )  # fmt: skip


def schedule(num, fnum, B, H, nqb):
    w = num.expand(B, H, nqb).to(torch.int32) + fnum.expand(B, H, nqb).to(torch.int32)
    return torch.argsort(w.reshape(-1), descending=True, stable=True).to(torch.int32)


def launch(q, k, v, num, idx, fnum, fidx, order, block=128, sched=None):
    B, H, S_Q, D = q.shape
    H_KV, S_KV = k.shape[1], k.shape[2]
    cfg = choose_config(
        bst.SPEC,
        device=q.device,
        head_dim=D,
        dtype=q.dtype,
        group=H // H_KV,
        seq_len=S_KV,
        variant="causal",
        blocks=(block, block),
    )
    kd, vd = kv_descriptors(
        k, v, block_n=cfg["TILE_N"], block_d=block_d(D), tma=None, op="block_sparse_order_probe"
    )
    out = torch.empty_like(q)
    lse = torch.empty((B, H, S_Q), dtype=torch.float32, device=q.device)
    nqb = -(-S_Q // block)
    sub = block // cfg["TILE_M"]
    n_items = nqb * sub * B * H
    if order == 2:
        if sched is None:
            sched = schedule(num, fnum, B, H, nqb)
        grid = (n_items, 1)
    elif order in (3, 4):
        sms = torch.cuda.get_device_properties(q.device).multi_processor_count if q.is_cuda else 4
        grid = (min(n_items, sms * (1 if cfg["TILE_M"] == 128 else 2)), 1)
        sched = torch.zeros(1, dtype=torch.int32, device=q.device)
    else:
        sched = num
        grid = (nqb * sub, B * H)
    _kern[grid](
        q,
        k,
        v,
        out,
        lse,
        num,
        idx,
        fnum,
        fidx,
        kd,
        vd,
        sched,
        *q.stride(),
        *k.stride(),
        *v.stride(),
        *out.stride(),
        *_bcast_strides(num, 3),
        *_bcast_strides(idx, 3),
        *_bcast_strides(fnum, 3),
        *_bcast_strides(fidx, 3),
        H,
        H // H_KV,
        S_Q,
        S_KV,
        nqb,
        D**-0.5,
        D=D,
        BLOCK_D=block_d(D),
        IS_CAUSAL=True,
        IEEE=False,
        HAS_FULL=True,
        MASK_BM=block,
        MASK_BN=block,
        TMA=kd is not None,
        ORDER=order,
        N_ITEMS=n_items,
        **cfg.launch_kwargs(),
    )
    return out, lse, cfg


def lists(S, H, dens, block=128, seed=0):
    """Diagonal partial + random full blocks; dens: per-head densities (tensor [H])."""
    nb = S // block
    g = torch.Generator(device=DEV).manual_seed(seed)
    m = torch.arange(nb, device=DEV)
    p = ((dens * nb * (nb + 1) / 2 - nb) / (nb * (nb - 1) / 2)).clamp(0, 1).view(1, H, 1, 1)
    sel = (torch.rand(1, H, nb, nb, device=DEV, generator=g) < p) & (m[:, None] > m[None, :])
    fnum = sel.sum(-1, dtype=torch.int32)
    fidx = torch.argsort((~sel).to(torch.int8), dim=-1, stable=True).to(torch.int32)
    num = torch.ones(1, H, nb, dtype=torch.int32, device=DEV)
    idx = m.int().reshape(1, 1, nb, 1).expand(1, H, nb, 1).contiguous()
    return num, idx, fnum, fidx


NAMES = {
    0: "natural",
    1: "reversed_rows",
    2: "lpt_with_sort",
    "2g": "lpt_sched_given",
    3: "persistent_static",
    4: "persistent_dynamic",
}


def run_length(S: int, H: int = 28) -> list[dict]:
    """Every list case at length ``S``: outputs checked against order 0, then each order timed."""
    q, k, v = qwen_inputs(S)
    g = torch.Generator().manual_seed(1)
    cases = {
        "uniform 10%": torch.full((H,), 0.1),
        "uniform 30%": torch.full((H,), 0.3),
        "uneven heads 2%-60%": torch.linspace(0.02, 0.6, H)[torch.randperm(H, generator=g)],
    }
    rows = []
    for name, dens in cases.items():
        L = lists(S, H, dens.to(DEV))
        ref = launch(q, k, v, *L, 0)
        r = {"S": S, "case": name, "config": str(ref[2])}
        for o in (1, 2, 3, 4):
            got = launch(q, k, v, *L, o)
            r[f"diff_{o}"] = (got[0].float() - ref[0].float()).abs().max().item()
            if r[f"diff_{o}"] != 0 or not torch.equal(got[1], ref[1]):
                raise AssertionError(f"order {o} differs from order 0 ({name}, S={S}): {r}")
        sched = schedule(L[0], L[2], 1, H, S // 128)
        calls = {
            0: lambda L=L: launch(q, k, v, *L, 0),
            1: lambda L=L: launch(q, k, v, *L, 1),
            2: lambda L=L: launch(q, k, v, *L, 2),
            "2g": lambda L=L, sched=sched: launch(q, k, v, *L, 2, sched=sched),
            3: lambda L=L: launch(q, k, v, *L, 3),
            4: lambda L=L: launch(q, k, v, *L, 4),
        }
        rep = 30 if S <= 32768 else 8
        for _ in range(3):
            for o, fn in calls.items():
                r.setdefault(NAMES[o], []).append(cuda_time_ms(fn, warmup=2, rep=rep))
        r["sort_ms"] = cuda_time_ms(
            lambda L=L: schedule(L[0], L[2], 1, H, S // 128), warmup=2, rep=20
        )
        for o in NAMES.values():
            r[o + "_min"] = min(r[o])
        print(json.dumps(r), flush=True)
        rows.append(r)
    return rows


def main():
    res = {"env": env_info(), "cases": []}
    for S in (32768, 131072):
        res["cases"] += run_length(S)
        torch.cuda.empty_cache()
    with open(sys.argv[1], "w") as f:
        json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
