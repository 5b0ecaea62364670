"""`python -m triangle_mix`: a layer policy's round trip, the start-layer rule and a triangle layer.

Runs on the CPU with only the package's own dependencies (the HF integration is not imported).
"""

from __future__ import annotations

import sys

import torch
from sparse_kernels import attention, triangle_attention

from triangle_mix import LayerPolicy, __version__, suggest_start_layer


def main() -> int:
    policy = LayerPolicy.triangle_from(8, 4, sink=4, window=32, last=16)
    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, 4, 200, 32, generator=g)
    k = torch.randn(1, 2, 200, 32, generator=g)
    v = torch.randn(1, 2, 200, 32, generator=g)
    tri = triangle_attention(q, k, v, sink=policy.sink, window=policy.window, last=policy.last)
    dense = attention(q, k, v, causal=True)
    # the last `last` rows of a triangle layer are dense by construction
    err = float((tri.out[:, :, -policy.last :] - dense.out[:, :, -policy.last :]).abs().max())
    checks = {
        "policy JSON round trip": LayerPolicy.from_json(policy.to_json()) == policy,
        "start layer after the gradient drop (4)": suggest_start_layer(
            [1.0, 0.9, 0.5, 0.2, 0.05, 0.04, 0.02, 0.01], threshold=0.1
        )
        == 4,
        f"triangle layer's last rows equal dense (max error {err:.1e})": err < 1e-5,
    }
    print(f"triangle_mix {__version__}: policy {policy.kinds}, CPU")
    for name, ok in checks.items():
        print(f"  {name}: {'OK' if ok else 'FAILED'}")
    return 0 if all(checks.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
