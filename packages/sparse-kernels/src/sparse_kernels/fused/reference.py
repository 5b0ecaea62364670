"""Plain PyTorch forms of the fused ops, written as HF's Llama/Qwen2 modules compute them."""

from __future__ import annotations

import torch


def rms_norm_reference(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """``weight * (x / sqrt(mean(x^2) + eps))`` over the last dim, normalised in float32 and
    rounded to ``x.dtype`` before the weight (HF ``Qwen2RMSNorm`` / ``LlamaRMSNorm``)."""
    h = x.to(torch.float32)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(x.dtype)


def silu_mul_reference(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """``silu(gate) * up`` in the inputs' dtype (the gated MLP's middle, HF ``act_fn(g) * u``)."""
    return torch.nn.functional.silu(gate) * up


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def rotary_reference(
    q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotary embedding of ``q`` ``[B, H, S, D]`` and ``k`` ``[B, H_KV, S, D]`` with ``cos``/``sin``
    ``[B, S, D]``: ``x * cos + rotate_half(x) * sin`` (HF ``apply_rotary_pos_emb``)."""
    c, s = cos.unsqueeze(1), sin.unsqueeze(1)
    return q * c + _rotate_half(q) * s, k * c + _rotate_half(k) * s
