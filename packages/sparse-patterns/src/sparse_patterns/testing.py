"""Synthetic heads with planted structure (tests, benchmarks, docs)."""

from __future__ import annotations

import torch


def planted_grid_qkv(
    B: int,
    H: int,
    H_KV: int,
    S: int,
    D: int,
    *,
    stride: int,
    phase: int,
    vline: bool = True,
    slash: bool = True,
    strength: float = 8.0,
    noise: float = 0.3,
    seed: int = 0,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str = "cpu",
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q/k/v whose attention concentrates on a grid of the given stride and phase.

    Vertical lines: keys ``j = phase (mod stride)`` carry a shared direction every query
    aligns with. Slash lines: query ``i`` and key ``j`` share a residue embedding of
    ``i mod stride`` (needs ``D >= stride + 1`` unless ``slash=False``). Scores are scaled so
    that after the default ``D ** -0.5`` scale the planted logit is ``strength``.
    """
    g = torch.Generator(device="cpu").manual_seed(seed)
    q = torch.randn(B, H, S, D, generator=g) * noise
    k = torch.randn(B, H_KV, S, D, generator=g) * noise
    v = torch.randn(B, H_KV, S, D, generator=g)
    amp = (strength * D**0.5) ** 0.5
    i = torch.arange(S)
    if vline:
        q[..., 0] += amp
        k[..., (i - phase) % stride == 0, 0] += amp
    if slash:
        if stride + 1 > D:
            raise ValueError(
                f"planted slash lines need D >= stride + 1, got D={D}, stride={stride}"
            )
        res = torch.nn.functional.one_hot(i % stride, D - 1).float() * amp
        q[..., 1:] += res
        k[..., 1:] += res
    return q.to(device, dtype), k.to(device, dtype), v.to(device, dtype)


def planted_vertical_slash_qkv(
    B: int,
    H: int,
    H_KV: int,
    S: int,
    D: int,
    *,
    columns: list[int],
    offsets: list[int],
    strength: float = 8.0,
    noise: float = 0.3,
    seed: int = 0,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str = "cpu",
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q/k/v whose attention concentrates on key ``columns`` (vertical lines) and on the
    diagonals ``offsets`` (slash lines, via rotary-like position codes)."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    q = torch.randn(B, H, S, D, generator=g) * noise
    k = torch.randn(B, H_KV, S, D, generator=g) * noise
    v = torch.randn(B, H_KV, S, D, generator=g)
    amp = (strength * D**0.5) ** 0.5
    q[..., 0] += amp
    k[..., columns, 0] += amp
    # Slash lines: rotary-like codes with random frequencies make q_i . k_j a function of
    # i - j that peaks (value ``half``) where i - j is a planted offset.
    half = (D - 2) // 2
    freqs = torch.rand(half, generator=g, dtype=torch.float64) * torch.pi
    pos = torch.arange(S, dtype=torch.float64)

    def code(x: torch.Tensor) -> torch.Tensor:
        a = x[:, None] * freqs[None, :]
        return torch.cat([torch.cos(a), torch.sin(a)], -1)

    c = (strength * D**0.5 / half) ** 0.5
    q[..., 1 : 1 + 2 * half] += (code(pos) * c).float()
    k[..., 1 : 1 + 2 * half] += (sum(code(pos + o) for o in offsets) * c).float()
    return q.to(device, dtype), k.to(device, dtype), v.to(device, dtype)


def planted_boundary_qkv(
    spans: list[tuple[int, int]],
    *,
    H: int = 2,
    D: int = 64,
    strength: float = 10.0,
    seed: int = 0,
):
    """A planted Q-boundary head: text (modality 0) queries attend a few text columns, other
    queries attend a few video columns. Returns ``q [1, H, S, D], k, v [1, 1, S, D], layout``."""
    from .layout import TokenLayout

    lay = TokenLayout.from_spans(spans, tokens_per_frame=32)
    S = lay.modality.numel()
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(1, H, S, D, generator=g) * 0.3
    k = torch.randn(1, 1, S, D, generator=g) * 0.3
    v = torch.randn(1, 1, S, D, generator=g)
    amp = (strength * D**0.5) ** 0.5
    text = lay.modality == 0
    q[..., text, 0] += amp
    q[..., ~text, 1] += amp
    tcols = torch.nonzero(text).flatten()[[2, 9, 20]]
    vcols = torch.nonzero(~text).flatten()[[5, 40, 77, 150]]
    k[..., tcols, 0] += amp
    k[..., vcols, 1] += amp
    return q, k, v, lay
