"""Test helpers: seeded input factories and the error-budget assertion of STYLE.md.

The error budget: a kernel and a low-precision PyTorch run of the same op are both compared with
a float64 golden result; the kernel passes when its max error is at most ``2x`` the PyTorch
error plus a rounding floor for the dtype. NaN or inf where the golden is finite fails at once.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from types import MappingProxyType

import torch

# Rounding floors per dtype: a few ulps at the magnitude of attention outputs (|out| <~ 1).
ROUNDING_FLOOR = MappingProxyType(
    {
        torch.float16: 2e-3,
        torch.bfloat16: 1.6e-2,
        torch.float32: 2e-5,
        torch.float64: 1e-10,
    }
)


def default_device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def on_gpu() -> bool:
    return torch.cuda.is_available()


def kernel_dtypes() -> list[torch.dtype]:
    """Dtypes a kernel test should cover here: bf16 only where kernels are compiled (the
    interpreter's bf16 ``tl.dot`` is wrong)."""
    if on_gpu() and os.environ.get("TRITON_INTERPRET", "0") in ("", "0"):
        return [torch.float16, torch.bfloat16, torch.float32]
    return [torch.float16, torch.float32]


def make_qkv(
    B: int,
    H: int,
    H_KV: int,
    S_Q: int,
    S_KV: int,
    D: int,
    *,
    dtype: torch.dtype = torch.float16,
    device: torch.device | str | None = None,
    seed: int = 0,
    layout: str = "bhsd",
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Random q ``[B, H, S_Q, D]``, k/v ``[B, H_KV, S_KV, D]`` from a seeded generator.

    ``layout="bshd"`` returns the same logical shapes as non-contiguous views of ``[B, S, H, D]``
    storage (what HF models hand to attention functions).
    """
    device = torch.device(device) if device is not None else default_device()
    g = torch.Generator(device="cpu").manual_seed(seed)

    def rnd(h: int, s: int) -> torch.Tensor:
        if layout == "bshd":
            t = torch.randn(B, s, h, D, generator=g, dtype=torch.float32).transpose(1, 2)
        elif layout == "bhsd":
            t = torch.randn(B, h, s, D, generator=g, dtype=torch.float32)
        else:
            raise ValueError(f"layout: expected 'bhsd' or 'bshd', got {layout!r}")
        return t.to(device=device, dtype=dtype)

    return rnd(H, S_Q), rnd(H_KV, S_KV), rnd(H_KV, S_KV)


def poison_(t: torch.Tensor) -> torch.Tensor:
    """Fill with NaN so that an element the kernel never writes shows up."""
    return t.fill_(float("nan"))


@dataclass(frozen=True)
class BudgetReport:
    kernel_err: float
    torch_err: float
    floor: float

    @property
    def budget(self) -> float:
        return 2.0 * self.torch_err + self.floor


def _max_err(x: torch.Tensor, golden: torch.Tensor) -> float:
    x64 = x.to(torch.float64)
    g64 = golden.to(torch.float64)
    both_neginf = torch.isneginf(x64) & torch.isneginf(g64)
    diff = (x64 - g64).abs().masked_fill(both_neginf, 0.0)
    if diff.numel() == 0:
        return 0.0
    return float(diff.max())


def assert_close_budget(
    actual: torch.Tensor,
    low_precision: torch.Tensor,
    golden: torch.Tensor,
    *,
    dtype: torch.dtype | None = None,
    floor: float | None = None,
    name: str = "out",
) -> BudgetReport:
    """Assert ``err(actual) <= 2 * err(low_precision) + floor`` against ``golden`` (max abs).

    ``-inf`` must match ``-inf`` exactly (empty rows); any other non-finite value fails.
    """
    if actual.shape != golden.shape:
        raise AssertionError(f"{name}: shape {tuple(actual.shape)} != golden {tuple(golden.shape)}")
    a = actual.detach().cpu()
    g = golden.detach().cpu()
    lp = low_precision.detach().cpu()
    if not torch.equal(torch.isneginf(a), torch.isneginf(g)):
        n = int((torch.isneginf(a) != torch.isneginf(g)).sum())
        raise AssertionError(f"{name}: -inf pattern differs from the golden in {n} elements")
    bad = ~torch.isfinite(a) & ~torch.isneginf(g)
    if bool(bad.any()):
        raise AssertionError(
            f"{name}: {int(bad.sum())} non-finite elements (NaN/inf) in the result"
        )
    floor = ROUNDING_FLOOR[dtype or actual.dtype] if floor is None else floor
    rep = BudgetReport(_max_err(a, g), _max_err(lp, g), floor)
    if not rep.kernel_err <= rep.budget:
        raise AssertionError(
            f"{name}: max error {rep.kernel_err:.3e} exceeds budget {rep.budget:.3e} "
            f"(2 x PyTorch low-precision error {rep.torch_err:.3e} + floor {rep.floor:.1e})"
        )
    return rep


def relative_error(x: torch.Tensor, ref: torch.Tensor) -> float:
    """``||x - ref|| / ||ref||`` in float64 (approximation-quality metric, not a kernel check)."""
    x64, r64 = x.to(torch.float64), ref.to(torch.float64)
    return float((x64 - r64).norm() / r64.norm().clamp_min(1e-300))


def flex_attention_compiled(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, block_mask
) -> torch.Tensor:
    """Compiled FlexAttention with a ``BlockMask`` of any block size the kernels use (32-128).

    Inductor's flex kernel needs its tiles to divide the mask's blocks (its default 128-row tile
    rejects 32- and 64-blocks), so the tiles are capped at the mask's block sizes.
    """
    bq, bk = block_mask.BLOCK_SIZE
    opts = {"BLOCK_M": min(int(bq), 64), "BLOCK_N": min(int(bk), 64)} if min(bq, bk) < 128 else None
    fn = _compiled_flex()
    return fn(q, k, v, block_mask=block_mask, enable_gqa=True, kernel_options=opts)


@functools.cache
def _compiled_flex():
    """FlexAttention compiled once per process: each ``torch.compile`` wrapper has its own
    cache of compiled graphs."""
    from torch.nn.attention.flex_attention import flex_attention

    return torch.compile(flex_attention, dynamic=False)
