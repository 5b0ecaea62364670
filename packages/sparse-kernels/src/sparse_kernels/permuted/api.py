"""Public permuted block-sparse attention op (Grid, Q-Boundary and 2D-Boundary heads)."""

from __future__ import annotations

import torch

from .._types import AttentionOutput
from .._validate import check_qkv, check_scale, check_triton_head_dim, resolve_impl
from ..sparse_plan import SparsePlan
from .reference import permuted_block_sparse_attention_reference

_OP = "permuted_block_sparse_attention"
# Block sizes the Triton kernel takes (powers of two: they are tile extents).
TRITON_BLOCK_SIZES = (16, 32, 64, 128, 256)


def _check_plan_fits(plan: object, B: int, H: int, H_KV: int, S_Q: int, S_KV: int, device) -> None:
    """The plan is for these q, k, v: lengths, device, batch and heads (Python only)."""
    if not isinstance(plan, SparsePlan):
        raise TypeError(f"{_OP}: plan: expected a SparsePlan, got {type(plan).__name__}")
    if plan.seq_lengths != (S_Q, S_KV):
        raise ValueError(
            f"{_OP}: plan.seq_lengths: expected (S_Q, S_KV) = {(S_Q, S_KV)} (from q and k), "
            f"got {plan.seq_lengths}"
        )
    if plan.device != device:
        raise ValueError(
            f"{_OP}: plan: expected tensors on {device} (q's device), got {plan.device}"
        )
    if plan.batch not in (1, B):
        raise ValueError(f"{_OP}: plan: expected batch dims of 1 or B={B}, got {plan.batch}")
    if plan.heads not in (1, H):
        raise ValueError(f"{_OP}: plan: expected head dims of 1 or H={H}, got {plan.heads}")
    if plan.kv_perm is not None and plan.kv_perm.shape[1] not in (1, H_KV, H):
        raise ValueError(
            f"{_OP}: plan.kv_perm: expected 1, H_KV={H_KV} or H={H} heads, got "
            f"{plan.kv_perm.shape[1]}"
        )


def permuted_block_sparse_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    plan: SparsePlan,
    *,
    scale: float | None = None,
    impl: str = "auto",
) -> AttentionOutput:
    """Attention over the pairs of a :class:`~sparse_kernels.SparsePlan`, read and written
    through its permutations.

    The kernel under MMInference's Grid, Q-Boundary and 2D-Boundary heads. Rows and columns are
    reordered inside the kernel by index-driven loads and stores; no permuted copy of q, k, v or
    the output is ever made, and the result comes back in ORIGINAL order. The attended set is
    the plan's (its docstring; ``plan.to_dense(heads=H)`` gives it as a bool mask). Because
    causality is evaluated on original positions, a causal Grid head stays exact after the
    permutation. A row that attends nothing gets ``out = 0`` and ``lse = -inf``.

    Run lists: a listed key block whose keys form a progression (with step 1: every block of an
    identity order and of a modality order that does not cross a segment end; with the grid
    stride: every block inside one grid line) can go to the plan's run list: the kernel then
    computes the tile's key positions instead of reading the key permutation (the indirection
    costs about 30% at 128K on an H100, ``results/boundary/boundary-gather-cost-H100-2026-11-23.json``).
    :func:`~sparse_kernels.permuted.split_run_blocks` makes the split.

    Args:
        q: ``[B, H, S_Q, D]``; k, v: ``[B, H_KV, S_KV, D]``, ``H % H_KV == 0`` (GQA is native, K/V
            are never repeated). fp16, bf16 or fp32.
        plan: a :class:`~sparse_kernels.SparsePlan` with ``seq_lengths == (S_Q, S_KV)`` on q's
            device, batch dims 1 or B, head dims 1 or H, ``kv_perm`` heads 1, H_KV (per KV head)
            or H (per query head: a query head of a GQA group may order the shared K/V its own
            way; the kernel gathers, so it costs nothing extra). Its contents are not checked
            here (they were at its construction, unless its builder turned that off): invalid
            contents are undefined behaviour. The Triton kernel bounds counts, ``q_perm``
            entries and run steps itself, but an out-of-range block number, run start or
            ``kv_perm`` entry may make it read out of bounds (a crash).
        scale: softmax scale, default ``D ** -0.5``.
        impl: ``"triton"`` (block sizes powers of two 16..256), ``"reference"`` (any block
            size) or ``"auto"`` (triton on CUDA, reference elsewhere).

    Returns:
        ``AttentionOutput(out, lse)`` in original row order.
    """
    B, H, H_KV, S_Q, S_KV, D = check_qkv(q, k, v)
    scale = check_scale(scale, D)
    _check_plan_fits(plan, B, H, H_KV, S_Q, S_KV, q.device)
    which = resolve_impl(impl, q.device, _OP)
    if which == "reference":
        return permuted_block_sparse_attention_reference(q, k, v, plan, scale=scale)
    check_triton_head_dim(D, _OP)
    for name, b in zip(("block_m", "block_n"), plan.block_size):
        if b not in TRITON_BLOCK_SIZES:
            raise NotImplementedError(
                f"{_OP}: the Triton kernel supports {name} in {TRITON_BLOCK_SIZES}, got {b} "
                f"(impl='reference' takes any block size)"
            )
    from .triton import _launch_permuted_fwd

    out, lse = _launch_permuted_fwd(q, k, v, plan, scale=scale)
    return AttentionOutput(out, lse)
