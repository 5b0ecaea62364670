"""`python -m sparse_patterns`: plan and run one MMInference layer on a small mixed prompt.

Runs on the CPU (the kernels' PyTorch references) with only the package's own dependencies.
"""

from __future__ import annotations

import sys

import torch
from sparse_kernels import attention

from sparse_patterns import (
    Dense,
    Grid,
    HeadConfig,
    QBoundary,
    TokenLayout,
    VerticalSlash,
    __version__,
    mminference_attention,
)


def main() -> int:
    g = torch.Generator().manual_seed(0)
    # 64 text tokens, a 4-frame video of 64 tokens per frame, 40 text tokens
    layout = TokenLayout.from_spans([(0, 64), (2, 256), (0, 40)], tokens_per_frame=64)
    q = torch.randn(1, 4, 360, 32, generator=g)
    k = torch.randn(1, 2, 360, 32, generator=g)
    v = torch.randn(1, 2, 360, 32, generator=g)
    dense = attention(q, k, v, causal=True).out
    all_dense = mminference_attention(q, k, v, [HeadConfig(Dense())] * 4, layout).out
    mixed_heads = [HeadConfig(Grid())] * 2 + [HeadConfig(VerticalSlash(64, 128), QBoundary())] * 2
    mixed = mminference_attention(q, k, v, mixed_heads, layout).out
    err = float((all_dense - dense).abs().max())
    checks = {
        f"Dense heads equal dense attention (max error {err:.1e})": err < 1e-5,
        "Grid + Vertical-Slash heads: finite output": bool(torch.isfinite(mixed).all()),
    }
    print(f"sparse_patterns {__version__}: one layer, 4 heads, {q.shape[2]} tokens, CPU")
    for name, ok in checks.items():
        print(f"  {name}: {'OK' if ok else 'FAILED'}")
    return 0 if all(checks.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
