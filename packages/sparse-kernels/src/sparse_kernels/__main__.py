"""`python -m sparse_kernels`: run the dense Triton kernel on a small problem and check it.

On a machine without CUDA the kernel runs under the Triton interpreter (slow, small sizes).
"""

from __future__ import annotations

import os
import sys
import time

import torch


def main() -> int:
    cuda = torch.cuda.is_available()
    if not cuda:
        os.environ.setdefault("TRITON_INTERPRET", "1")
    from sparse_kernels import attention
    from sparse_kernels.attention import attention_reference
    from sparse_kernels.testing import make_qkv

    dev = "cuda" if cuda else "cpu"
    dtype = torch.bfloat16 if cuda else torch.float16
    S = 8192 if cuda else 256
    q, k, v = make_qkv(1, 28, 4, S, S, 128, dtype=dtype, device=dev)
    if cuda:  # compile first, so the time is the kernel's (the interpreter compiles nothing)
        attention(q, k, v, impl="triton")
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    res = attention(q, k, v, impl="triton")
    if cuda:
        torch.cuda.synchronize()
    dt = time.perf_counter() - t0
    gold = attention_reference(q[:, :7], k[:, :1], v[:, :1], compute_dtype=torch.float64)
    err = float((res.out[:, :7].double() - gold.out).norm() / gold.out.norm())
    where = torch.cuda.get_device_name() if cuda else "CPU (Triton interpreter)"
    print(f"sparse_kernels.attention on {where}: B=1 H=28 H_KV=4 S={S} D=128 {dtype}, causal")
    print(f"  time {dt * 1e3:.1f} ms; relative error vs float64 reference (7 heads) {err:.2e}")
    ok = err < 2e-2
    print("  check:", "OK" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
