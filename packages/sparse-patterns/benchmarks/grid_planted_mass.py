"""Where the attention mass of ``bench_grid.py``'s planted grid sits (CPU, one KV head, the last
32 rows): on the exact grid lines, or on slash bands of +-w tokens around them.

The slash lines are planted through 32 Fourier pairs of ``(i mod 256)`` in ``q`` and ``k``, so
``q_i . k_j`` follows a Dirichlet kernel in ``(i - j) mod 256``: its main lobe also lifts the
neighbouring offsets. A Grid head lists the exact lines only, so its mass recall on these inputs is
bounded by the first row this prints.

    uv run python packages/sparse-patterns/benchmarks/grid_planted_mass.py
"""

from __future__ import annotations

import math

import torch

D, TPF, ROWS = 128, 256, 32


def main() -> None:
    for S in (32768, 131072):
        g = torch.Generator().manual_seed(0)
        i = torch.arange(S)
        rows = torch.arange(S - ROWS, S)
        q = torch.randn(ROWS, D, generator=g) * 0.4
        k = torch.randn(S, D, generator=g) * 0.4
        amp = (10.0 * D**0.5) ** 0.5  # as bench_grid._video_qkv: logit +10 on the lines
        q[:, 0] += amp
        on_line = (i % TPF) == 0  # vertical lines, phase 0
        k[:, 0] += amp * on_line
        n_freq = min(32, (D - 2) // 2)
        m = torch.arange(1, n_freq + 1, dtype=torch.float32)

        def code(pos, m=m):
            ang = 2 * math.pi * (pos % TPF).float()[:, None] * m[None, :] / TPF
            return torch.cat([torch.cos(ang), torch.sin(ang)], -1)

        c = (10.0 * D**0.5 / n_freq) ** 0.5
        q[:, 1 : 1 + 2 * n_freq] += c * code(rows)
        k[:, 1 : 1 + 2 * n_freq] += c * code(i)
        s = (q @ k.T) * D**-0.5
        p = s.masked_fill(i[None, :] > rows[:, None], float("-inf")).softmax(-1)
        d = (rows[:, None] - i[None, :]) % TPF
        for w in (0, 1, 2, 4):
            band = (d <= w) | (d >= TPF - w)
            mass = float((p * (on_line[None, :] | band)).sum(-1).mean())
            print(f"S={S}: vertical lines + slash band +-{w}: {mass:.4f} of the mass")


if __name__ == "__main__":
    main()
