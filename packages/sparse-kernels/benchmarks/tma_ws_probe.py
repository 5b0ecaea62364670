"""Probe: do copy-engine loads (device-side tensor descriptors) and Triton's warp specialization
(``tl.range(..., warp_specialize=True)``) speed up a stripped-down dense causal attention loop on
this GPU, against our dense Triton kernel in the same process? Five launch configs, each with
and without either; a config that fails to compile is recorded with its error. One JSON line per
variant on stdout.

    python packages/sparse-kernels/benchmarks/tma_ws_probe.py 32768 > probe.jsonl

It sets Triton's allocator (device-side descriptors need one): a script, not library code. The
package's kernels use host-built descriptors (``_triton/tma.py``).
"""

import json
import sys
import time

import torch
import triton
import triton.language as tl
from sparse_kernels.attention.triton import _launch_attention_fwd


def alloc(size, alignment, stream):
    return torch.empty(size, device="cuda", dtype=torch.int8)


triton.set_allocator(alloc)


@triton.jit
def _inner(
    acc,
    l_i,
    m_i,
    q,
    desc_k,
    desc_v,
    k_ptrs0,
    v_ptrs0,
    stride_k_s,
    stride_v_s,
    kv_row0,
    q_pos,
    offs_n,
    lo,
    hi,
    qk_scale,
    BLOCK_N: tl.constexpr,
    MASKED: tl.constexpr,
    USE_TMA: tl.constexpr,
    WS: tl.constexpr,
):
    for start_n in tl.range(lo, hi, BLOCK_N, warp_specialize=WS):
        if USE_TMA:
            k = desc_k.load([kv_row0 + start_n, 0]).T
            v = desc_v.load([kv_row0 + start_n, 0])
        else:
            k = tl.load(k_ptrs0 + start_n * stride_k_s)
            v = tl.load(v_ptrs0 + start_n * stride_v_s)
        qk = tl.dot(q, k)
        if MASKED:
            cols = start_n + offs_n
            qk = tl.where(cols[None, :] <= q_pos[:, None], qk, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)
        p = tl.math.exp2(qk * qk_scale - m_new[:, None])
        alpha = tl.math.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None]
        acc = tl.dot(p.to(v.dtype), v, acc)
        m_i = m_new
    return acc, l_i, m_i


@triton.jit
def _probe_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    o_ptr,
    H,
    GROUP,
    S,
    KV_ROWS,
    sm_scale,
    D: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    USE_TMA: tl.constexpr,
    WS: tl.constexpr,
):
    start_m = tl.num_programs(0) - 1 - tl.program_id(0)
    bh = tl.program_id(1)
    h = bh % H
    b = bh // H
    h_kv = h // GROUP
    H_KV = H // GROUP
    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, D)
    q_row0 = bh.to(tl.int64) * S
    kv_row0 = (b * H_KV + h_kv) * S
    q = tl.load(q_ptr + (q_row0 + offs_m[:, None]) * D + offs_d[None, :])
    desc_k = tl.make_tensor_descriptor(
        k_ptr, shape=[KV_ROWS, D], strides=[D, 1], block_shape=[BLOCK_N, D]
    )
    desc_v = tl.make_tensor_descriptor(
        v_ptr, shape=[KV_ROWS, D], strides=[D, 1], block_shape=[BLOCK_N, D]
    )
    k_ptrs0 = k_ptr + (kv_row0.to(tl.int64) + offs_n[None, :]) * D + offs_d[:, None]
    v_ptrs0 = v_ptr + (kv_row0.to(tl.int64) + offs_n[:, None]) * D + offs_d[None, :]
    qk_scale = sm_scale * 1.4426950408889634
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, D], tl.float32)
    q_pos = offs_m
    first = start_m * BLOCK_M
    full_hi = first // BLOCK_N * BLOCK_N
    hi = first + BLOCK_M
    acc, l_i, m_i = _inner(
        acc,
        l_i,
        m_i,
        q,
        desc_k,
        desc_v,
        k_ptrs0,
        v_ptrs0,
        D,
        D,
        kv_row0,
        q_pos,
        offs_n,
        0,
        full_hi,
        qk_scale,
        BLOCK_N,
        False,
        USE_TMA,
        WS,
    )
    acc, l_i, m_i = _inner(
        acc,
        l_i,
        m_i,
        q,
        desc_k,
        desc_v,
        k_ptrs0,
        v_ptrs0,
        D,
        D,
        kv_row0,
        q_pos,
        offs_n,
        full_hi,
        hi,
        qk_scale,
        BLOCK_N,
        True,
        USE_TMA,
        False,
    )
    out = acc / l_i[:, None]
    tl.store(
        o_ptr + (q_row0 + offs_m[:, None]) * D + offs_d[None, :], out.to(o_ptr.dtype.element_ty)
    )


def probe(q, k, v, BM, BN, warps, stages, tma, ws):
    B, H, S, D = q.shape
    o = torch.empty_like(q)
    grid = (S // BM, B * H)

    def call():
        _probe_kernel[grid](
            q,
            k,
            v,
            o,
            H,
            H // k.shape[1],
            S,
            B * k.shape[1] * S,
            D**-0.5,
            D=D,
            BLOCK_M=BM,
            BLOCK_N=BN,
            USE_TMA=tma,
            WS=ws,
            num_warps=warps,
            num_stages=stages,
        )

    return call, o


def main():
    seqs = [int(s) for s in sys.argv[1].split(",")] if len(sys.argv) > 1 else [32768]
    torch.manual_seed(0)
    H, H_KV, D = 28, 4, 128
    info = {
        "gpu": torch.cuda.get_device_name(),
        "triton": triton.__version__,
        "torch": torch.__version__,
    }
    print(json.dumps(info), flush=True)
    variants = []
    for BM, BN, w, st in [
        (128, 128, 8, 3),
        (128, 64, 8, 3),
        (128, 128, 8, 2),
        (128, 64, 4, 3),
        (128, 128, 4, 2),
    ]:
        for tma in (False, True):
            for ws in (False, True):
                variants.append((BM, BN, w, st, tma, ws))
    for S in seqs:
        q = torch.randn(1, H, S, D, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(1, H_KV, S, D, device="cuda", dtype=torch.bfloat16)
        v = torch.randn(1, H_KV, S, D, device="cuda", dtype=torch.bfloat16)
        flops = 4 * H * D * S * S / 2
        ref_call = lambda q=q, k=k, v=v: _launch_attention_fwd(q, k, v, causal=True, scale=D**-0.5)
        ref, _ = ref_call()
        base = triton.testing.do_bench(ref_call, warmup=50, rep=300)
        print(
            json.dumps(
                {
                    "S": S,
                    "variant": "ours-triton (tuned table)",
                    "ms": base,
                    "tflops": flops / base / 1e9,
                }
            ),
            flush=True,
        )
        for BM, BN, w, st, tma, ws in variants:
            rec = {"S": S, "BM": BM, "BN": BN, "warps": w, "stages": st, "tma": tma, "ws": ws}
            try:
                t0 = time.time()
                call, o = probe(q, k, v, BM, BN, w, st, tma, ws)
                call()
                torch.cuda.synchronize()
                rec["compile_s"] = round(time.time() - t0, 1)
                rec["max_err_vs_ours"] = (o.float() - ref.float()).abs().max().item()
                ms = triton.testing.do_bench(call, warmup=50, rep=300)
                rec.update(ms=ms, tflops=flops / ms / 1e9, vs_ours=base / ms)
            except Exception as e:  # noqa: BLE001 - a probe: record and go on
                rec["error"] = f"{type(e).__name__}: {str(e)[:300]}"
            print(json.dumps(rec), flush=True)
        base2 = triton.testing.do_bench(ref_call, warmup=50, rep=300)
        print(json.dumps({"S": S, "variant": "ours-triton again", "ms": base2}), flush=True)


if __name__ == "__main__":
    main()
