"""Public dense attention op."""

from __future__ import annotations

import torch

from .._types import AttentionOutput
from .._validate import check_bool, check_qkv, check_scale, check_triton_head_dim, resolve_impl
from ..fa4 import problem as fa4_problem
from .reference import attention_reference


def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    causal: bool = True,
    scale: float | None = None,
    impl: str = "auto",
) -> AttentionOutput:
    """Dense flash attention with log-sum-exp.

    Args:
        q: ``[B, H, S_Q, D]``; k, v: ``[B, H_KV, S_KV, D]`` with ``H % H_KV == 0`` (GQA is handled
            in the kernel, K/V are never repeated). fp16, bf16 or fp32, one dtype and device.
        causal: query row ``i`` sits at absolute position ``i + S_KV - S_Q`` and attends key ``j``
            only if ``j <= i + S_KV - S_Q``. Rows whose position is negative (``S_Q > S_KV``)
            attend nothing: ``out = 0``, ``lse = -inf``.
        scale: softmax scale, finite and positive; default ``D ** -0.5``.
        impl: ``"triton"`` (CUDA, or the CPU under ``TRITON_INTERPRET=1``), ``"fa4"``
            (FlashAttention-4, the ``hopper`` extra: fp16/bf16 on an sm90 GPU, head dims 8..256
            in steps of 8; anything else raises, naming why), ``"reference"`` (plain PyTorch,
            scores and softmax in float32) or ``"auto"``: on CUDA, FA4 where
            :data:`sparse_kernels.fa4.AUTO_FA4` lists this op for the GPU and FA4 can run the
            input, else triton; the reference elsewhere.
            The Triton kernel supports head dims up to 128 (any size; padded to a power of two).

    Returns:
        ``AttentionOutput(out, lse)``: ``out`` in q's dtype, ``lse`` float32 ``[B, H, S_Q]``.
        FA4's ``out`` is the ``[B, H, S_Q, D]`` view of a ``[B, S_Q, H, D]`` buffer (what HF
        attention layers want next); the other engines return a contiguous ``out``.

    Non-finite inputs: a NaN or inf in ``k`` at a key that a row does not attend (causally
    masked) never reaches that row: its score is masked before the softmax. In ``v``, every key
    that some row attends is read beside keys other rows do not attend (the Triton kernel's
    diagonal tile; the reference's whole ``P @ V``), so a NaN there may reach rows that do not
    attend it (``0 * NaN``), as in torch SDPA.
    """
    _, _, _, _, _, D = check_qkv(q, k, v)
    scale = check_scale(scale, D)
    causal = check_bool(causal, "causal", "attention")
    which = resolve_impl(impl, q.device, "attention", fa4=lambda: fa4_problem(q), like=q)
    if which == "reference":
        return attention_reference(q, k, v, causal=causal, scale=scale)
    if which == "fa4":
        from ..fa4.engine import dense

        return dense(q, k, v, causal=causal, scale=scale)
    check_triton_head_dim(D, "attention")
    from .triton import _launch_attention_fwd

    out, lse = _launch_attention_fwd(q, k, v, causal=causal, scale=scale)
    return AttentionOutput(out, lse)
