"""Time the dense attention kernel under explicit configs (bypassing autotune) on a GPU.

Usage: python3 scripts/tune_dense.py [S ...]   (prints a table; Qwen2.5-7B shape, causal, bf16)
"""

from __future__ import annotations

import sys

import torch
import torch.nn.functional as F
import triton
from sparse_kernels.attention.triton import _attn_fwd_kernel
from sparse_kernels.benchmarking import attention_flops, causal_pairs, cuda_time_ms
from torch.nn.attention import SDPBackend, sdpa_kernel

CONFIGS = [
    (128, 128, 8, 3),
    (128, 128, 8, 2),
    (128, 64, 8, 3),
    (128, 64, 4, 3),
    (128, 64, 8, 4),
    (128, 64, 4, 4),
    (64, 128, 4, 3),
    (128, 128, 4, 2),
    (256, 64, 8, 3),
    (128, 32, 4, 4),
]


def main():
    sizes = [int(s) for s in sys.argv[1:]] or [32768, 131072]
    B, H, H_KV, D = 1, 28, 4, 128
    for S in sizes:
        q = torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(B, H_KV, S, D, device="cuda", dtype=torch.bfloat16)
        v = torch.randn(B, H_KV, S, D, device="cuda", dtype=torch.bfloat16)
        flops = attention_flops(B, H, causal_pairs(S, S), D)
        kk, vv = k.repeat_interleave(7, 1), v.repeat_interleave(7, 1)
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            t_cudnn = cuda_time_ms(
                lambda: F.scaled_dot_product_attention(q, kk, vv, is_causal=True), rep=5
            )
        print(f"S={S} cuDNN {t_cudnn:.2f} ms {flops / t_cudnn / 1e9:.0f} TFLOP/s", flush=True)
        out = torch.empty_like(q)
        lse = torch.empty(B, H, S, device="cuda", dtype=torch.float32)
        for bm, bn, w, st in CONFIGS:
            grid = (triton.cdiv(S, bm), B * H)

            def run():
                _attn_fwd_kernel.fn[grid](
                    q,
                    k,
                    v,
                    out,
                    lse,
                    *q.stride(),
                    *k.stride(),
                    *v.stride(),
                    *out.stride(),
                    H,
                    H // H_KV,
                    S,
                    S,
                    D**-0.5,
                    0,
                    D=D,
                    BLOCK_D=128,
                    IS_CAUSAL=True,
                    IEEE=False,
                    BLOCK_M=bm,
                    BLOCK_N=bn,
                    num_warps=w,
                    num_stages=st,
                )

            try:
                t = cuda_time_ms(run, rep=5)
            except Exception as e:  # noqa: BLE001 - report configs that do not compile (smem)
                print(f"  {bm}x{bn} w{w} s{st}: failed ({type(e).__name__})", flush=True)
                continue
            print(
                f"  {bm}x{bn} w{w} s{st}: {t:.2f} ms {flops / t / 1e9:.0f} TFLOP/s ratio {t_cudnn / t:.3f}",
                flush=True,
            )


if __name__ == "__main__":
    main()
