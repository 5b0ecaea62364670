"""Plain PyTorch oracle for dense attention (runs anywhere, can upcast to float64)."""

from __future__ import annotations

import torch

from .._types import AttentionOutput


def masked_attention_reference(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor,
    *,
    scale: float,
    compute_dtype: torch.dtype | None = None,
) -> AttentionOutput:
    """Attention of q over k/v restricted to ``mask`` (bool, broadcastable to ``[B, H, S_Q, S_KV]``).

    Accepts fp16, bf16, fp32 and float64 inputs. ``compute_dtype`` is the precision of every
    step (scores ``q @ k^T``, softmax, lse, ``P @ V``); by default float32, or float64 for float64
    inputs, so an fp16 score above 65504 stays finite. A lower ``compute_dtype`` (the input
    dtype) gives the low-precision PyTorch run of the error budgets; float64 the golden result.
    The output is cast back to q's dtype, ``lse`` is float32.

    GQA is expanded here (the reference favours clarity over memory). Rows with no allowed key
    give ``out = 0`` and ``lse = -inf``. Non-finite values: a key masked for a row never reaches
    it through the scores (they are masked before the softmax); in ``P @ V`` a value of ``v`` at
    a key that no row of the (batch, head) attends is dropped, but one that another row attends
    reaches every row (``0 * NaN = NaN``), as in torch SDPA.
    """
    cd = compute_dtype or torch.promote_types(q.dtype, torch.float32)
    H, H_KV = q.shape[1], k.shape[1]
    kk = k.to(cd).repeat_interleave(H // H_KV, dim=1)
    vv = v.to(cd).repeat_interleave(H // H_KV, dim=1)
    vv = vv.masked_fill(~mask.any(dim=-2)[..., None], 0.0)
    s = torch.matmul(q.to(cd), kk.transpose(-1, -2)) * scale
    s = s.masked_fill(~mask, float("-inf"))
    lse = torch.logsumexp(s.float() if cd != torch.float64 else s, dim=-1)
    empty = torch.isinf(lse) & (lse < 0)
    m = s.amax(dim=-1, keepdim=True)
    m = torch.where(torch.isinf(m), torch.zeros_like(m), m)
    p = torch.exp(s - m)
    denom = p.sum(dim=-1, keepdim=True)
    denom = torch.where(denom == 0, torch.ones_like(denom), denom)
    out = torch.matmul(p / denom, vv)
    out = out.masked_fill(empty[..., None], 0.0)
    return AttentionOutput(out.to(q.dtype), lse.to(torch.float32))


def causal_mask(
    S_Q: int, S_KV: int, device: torch.device | str = "cpu", q_offset: int | None = None
) -> torch.Tensor:
    """``[S_Q, S_KV]`` bool: row i (at position ``i + q_offset``, default ``S_KV - S_Q``) sees ``j <= pos``."""
    off = S_KV - S_Q if q_offset is None else q_offset
    pos = torch.arange(S_Q, device=device)[:, None] + off
    return torch.arange(S_KV, device=device)[None, :] <= pos


def attention_reference(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    causal: bool = True,
    scale: float | None = None,
    compute_dtype: torch.dtype | None = None,
) -> AttentionOutput:
    """Dense attention, causal alignment of DESIGN.md (row i at position ``i + S_KV - S_Q``).

    Computed in float32 (float64 for float64 inputs) unless ``compute_dtype`` says otherwise;
    see :func:`masked_attention_reference`."""
    S_Q, S_KV = q.shape[2], k.shape[2]
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    if causal:
        mask = causal_mask(S_Q, S_KV, q.device)
    else:
        mask = torch.ones(S_Q, S_KV, dtype=torch.bool, device=q.device)
    return masked_attention_reference(q, k, v, mask, scale=scale, compute_dtype=compute_dtype)
