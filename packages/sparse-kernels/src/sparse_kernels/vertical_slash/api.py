"""Public vertical-slash attention op (MInference's pattern), causal."""

from __future__ import annotations

import torch

from .._types import AttentionOutput
from .._validate import check_qkv, check_scale, check_triton_head_dim, resolve_impl
from .index import VerticalSlashIndex, build_vertical_slash_index
from .reference import vertical_slash_attention_reference

_OP = "vertical_slash_attention"


def vertical_slash_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    vertical_indices: torch.Tensor,
    slash_indices: torch.Tensor,
    *,
    scale: float | None = None,
    impl: str = "auto",
    block_m: int = 64,
    block_n: int = 64,
    index: VerticalSlashIndex | None = None,
    check_indices: bool = True,
) -> AttentionOutput:
    """MInference vertical-slash sparse attention (causal, ``S_Q == S_KV == S``).

    Attended set, exactly: query ``i`` attends key ``j`` iff ``j <= i`` and either
    (a) ``j`` is one of ``vertical_indices[b, h]``, or (b) the tile
    ``(i // block_m, j // block_n)`` is crossed by a slash diagonal: some ``o`` in
    ``slash_indices[b, h]`` and some row ``r`` of query block ``i // block_m`` with
    ``r - o`` in key block ``j // block_n``. Block rounding therefore adds whole key blocks around
    each slash (every diagonal becomes a band of ``block_m x block_n`` tiles, about
    ``block_m + block_n - 1`` keys wide per row); verticals are not rounded.
    :func:`sparse_kernels.vertical_slash.vertical_slash_mask` builds this set as a dense mask.

    Execution is two steps: :func:`build_vertical_slash_index` (on the device, all heads at once:
    merged key-block ranges per query block plus leftover vertical columns), then one kernel
    launch for all heads. Pass a prebuilt ``index`` to skip the first step.

    Args:
        q: ``[B, H, S, D]``; k, v: ``[B, H_KV, S, D]``, ``H % H_KV == 0`` (GQA native).
        vertical_indices: ``[B, H, NV]`` int32/int64 key columns in ``[0, S)``, each row sorted
            strictly ascending (required; unsorted or repeated entries raise ``ValueError``).
        slash_indices: ``[B, H, NS]`` int32/int64 diagonal offsets ``i - j`` in ``[0, S)``, each
            row sorted strictly ascending (required, as above).
        scale: softmax scale, default ``D ** -0.5``.
        impl: ``"triton"`` (CUDA, or CPU under ``TRITON_INTERPRET=1``), ``"reference"`` (dense
            PyTorch over the exact mask; memory ``O(B H S^2)``) or ``"auto"`` (triton on CUDA,
            reference elsewhere).
        block_m, block_n: tile sizes, 64 or 128 each.
        index: the result of ``build_vertical_slash_index(vertical_indices, slash_indices,
            seq_len=S, block_m=block_m, block_n=block_n)``; built here when ``None``.
        check_indices: when the index is built here, check the indices' range and order
            (``build_vertical_slash_index(check_contents=...)``, six host reads); ``False`` for
            callers whose indices are valid by construction.

    Returns:
        ``AttentionOutput(out, lse)``.
    """
    B, H, _, S_Q, S_KV, D = check_qkv(q, k, v)
    if S_Q != S_KV:
        raise NotImplementedError(
            f"{_OP}: only self-attention prefill (S_Q == S_KV) is supported, got S_Q={S_Q}, "
            f"S_KV={S_KV}"
        )
    scale = check_scale(scale, D)
    which = resolve_impl(impl, q.device, _OP)
    if index is None:
        for nm, t in (("vertical_indices", vertical_indices), ("slash_indices", slash_indices)):
            if isinstance(t, torch.Tensor) and t.device != q.device:
                raise ValueError(f"{_OP}: {nm}: expected device {q.device} (q's), got {t.device}")
        index = build_vertical_slash_index(
            vertical_indices, slash_indices, seq_len=S_Q, block_m=block_m, block_n=block_n,
            check_contents=check_indices,
        )  # fmt: skip
    elif not isinstance(index, VerticalSlashIndex):
        raise TypeError(f"{_OP}: index: expected a VerticalSlashIndex, got {type(index).__name__}")
    elif (index.seq_len, index.block_m, index.block_n) != (S_Q, block_m, block_n) or tuple(
        index.range_count.shape[:2]
    ) != (B, H):
        raise ValueError(
            f"{_OP}: index was built for seq_len={index.seq_len}, block_m={index.block_m}, "
            f"block_n={index.block_n}, [B, H]={list(index.range_count.shape[:2])}; expected "
            f"{S_Q}, {block_m}, {block_n}, [{B}, {H}]"
        )
    if which == "reference":
        return vertical_slash_attention_reference(
            q, k, v, vertical_indices, slash_indices,
            scale=scale, block_m=block_m, block_n=block_n,
        )  # fmt: skip
    check_triton_head_dim(D, _OP)
    from .triton import _launch_vertical_slash_fwd

    out, lse = _launch_vertical_slash_fwd(q, k, v, index, scale=scale)
    return AttentionOutput(out, lse)
