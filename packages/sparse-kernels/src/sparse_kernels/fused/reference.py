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
