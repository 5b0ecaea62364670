"""`python -m seqpar_approx`: Spava and ZigZag ring attention over a one-rank gloo group.

Runs on the CPU: the distributed code path against its single-process simulation and against
exact attention.
"""

from __future__ import annotations

import sys

import torch
import torch.distributed as dist

from seqpar_approx import (
    SpavaConfig,
    __version__,
    build_layout,
    dense_attention,
    ring_layout,
    simulate_spava_attention,
    spava_attention,
    zigzag_ring_attention,
)


def main() -> int:
    g = torch.Generator().manual_seed(0)
    n, n_q = 512, 32
    q = torch.randn(1, 4, n, 32, generator=g)
    k = torch.randn(1, 2, n, 32, generator=g)
    v = torch.randn(1, 2, n, 32, generator=g)
    cfg = SpavaConfig(num_hosts=1)
    layout = build_layout(n, query_len=n_q, config=cfg)
    ring = ring_layout(n, num_hosts=1)
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        local = (layout.shard(t, 0, dim=2) for t in (q, k, v))
        spava = spava_attention(*local, layout, cfg).out
        ring_out = zigzag_ring_attention(*(ring.shard(t, 0, dim=2) for t in (q, k, v)), ring).out
    finally:
        dist.destroy_process_group()
    simulated = layout.shard(simulate_spava_attention(q, k, v, layout, cfg).out, 0, dim=2)
    exact = ring.shard(dense_attention(q, k, v).out, 0, dim=2)
    err_spava = float((spava - simulated).abs().max())
    err_ring = float((ring_out - exact).abs().max())
    checks = {
        f"spava_attention equals its simulation (max error {err_spava:.1e})": err_spava < 1e-5,
        f"zigzag_ring_attention equals dense (max error {err_ring:.1e})": err_ring < 1e-5,
    }
    print(f"seqpar_approx {__version__}: {n} tokens on a one-rank gloo group, CPU")
    for name, ok in checks.items():
        print(f"  {name}: {'OK' if ok else 'FAILED'}")
    return 0 if all(checks.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
