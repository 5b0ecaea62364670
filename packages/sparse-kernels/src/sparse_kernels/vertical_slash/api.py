"""Public vertical-slash attention op (MInference's pattern), causal."""

from __future__ import annotations

import torch

from .._types import AttentionOutput
from .._validate import (
    check_bool,
    check_index_range,
    check_index_tensor,
    check_qkv,
    check_scale,
    check_triton_head_dim,
    resolve_impl,
)
from ..fa4 import block_lists_problem
from .index import (
    VerticalSlashIndex,
    _check_blocks,
    _check_indices,
    build_vertical_slash_index,
)
from .reference import vertical_slash_attention_reference

_OP = "vertical_slash_attention"


def _check_prebuilt(
    index: object,
    B: int,
    H: int,
    S: int,
    block_m: int,
    block_n: int,
    device: torch.device,
    contents: bool,
) -> None:
    """A caller's ``VerticalSlashIndex`` must match q and hold what the kernel can walk: its
    tensors' shapes, dtypes and device always; with ``contents``, counts within the padded widths
    and listed key blocks / columns inside the sequence (one host read each)."""
    if not isinstance(index, VerticalSlashIndex):
        raise TypeError(f"{_OP}: index: expected a VerticalSlashIndex, got {type(index).__name__}")
    if (index.seq_len, index.block_m, index.block_n) != (S, block_m, block_n):
        raise ValueError(
            f"{_OP}: index was built for seq_len={index.seq_len}, block_m={index.block_m}, "
            f"block_n={index.block_n}; expected {S}, {block_m}, {block_n}"
        )
    nqb, nkb = -(-S // block_m), -(-S // block_n)
    row = (("B", B), ("H", H), ("NQB", nqb))
    f = {}
    for name, width in (("range_count", None), ("range_start", "R"), ("range_end", "R"),
                        ("column_count", None), ("columns", "C")):  # fmt: skip
        dims = row if width is None else (*row, (width, None))
        f[name] = check_index_tensor(
            getattr(index, name), f"index.{name}", op=_OP, dims=dims, device=device
        )
    R, C = f["range_start"].shape[-1], f["columns"].shape[-1]
    if f["range_end"].shape[-1] != R:
        raise ValueError(
            f"{_OP}: index.range_end: expected width R={R} (index.range_start's), got "
            f"{f['range_end'].shape[-1]}"
        )
    if not contents:
        return
    check_index_range(f["range_count"], "index.range_count", 0, R + 1, op=_OP,
                      what=f"counts (at most the width R={R})")  # fmt: skip
    check_index_range(f["column_count"], "index.column_count", 0, C + 1, op=_OP,
                      what=f"counts (at most the width C={C})")  # fmt: skip
    listed = torch.arange(R, device=device) < f["range_count"][..., None]
    check_index_range(f["range_start"], "index.range_start", 0, nkb, op=_OP, listed=listed,
                      what="listed key-block starts")  # fmt: skip
    check_index_range(f["range_end"], "index.range_end", 1, nkb + 1, op=_OP, listed=listed,
                      what="listed key-block ends")  # fmt: skip
    listed = torch.arange(C, device=device) < f["column_count"][..., None]
    check_index_range(f["columns"], "index.columns", 0, S, op=_OP, listed=listed,
                      what="listed key columns")  # fmt: skip


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
            ``B`` and ``H`` are exactly q's: one row per query head (not per KV head), no
            broadcast of a size-1 batch or head dim. On q's device, any strides.
        slash_indices: ``[B, H, NS]`` int32/int64 diagonal offsets ``i - j`` in ``[0, S)``, each
            row sorted strictly ascending (required, as above; same shape rule).
        scale: softmax scale, finite and positive; default ``D ** -0.5``.
        impl: ``"triton"`` (CUDA, or CPU under ``TRITON_INTERPRET=1``), ``"fa4"`` (the
            ranges' tiles by FlashAttention-4's block-sparse kernel, the columns added in place by
            ours: ``docs/kernels/fa4.md``; the ``hopper`` extra, fp16/bf16 on an sm90 GPU, head
            dims 8..128 in steps of 8; anything else raises, naming why), ``"reference"`` (dense
            PyTorch over the exact mask, scores and softmax in float32; memory ``O(B H S^2)``) or
            ``"auto"`` (on CUDA, FA4 where :data:`sparse_kernels.fa4.AUTO_FA4` lists this op for
            the GPU and block size and FA4 can run the input, else triton; the reference
            elsewhere).
        block_m, block_n: tile sizes, 64 or 128 each.
        index: the result of ``build_vertical_slash_index(vertical_indices, slash_indices,
            seq_len=S, block_m=block_m, block_n=block_n)``; built here when ``None`` (except for
            the reference, which reads the indices themselves).
        check_indices: check the indices' range and order (``build_vertical_slash_index(
            check_contents=...)``, six host reads) and, for a prebuilt ``index``, that its counts
            fit its widths and its listed key blocks and columns lie inside the sequence (five
            more). ``False`` is for callers whose indices (and index) are valid by construction,
            such as ``sparse_patterns``' planner; invalid ones are then undefined behaviour.
            Shapes, dtypes and devices are checked either way.

    Returns:
        ``AttentionOutput(out, lse)``.

    Non-finite inputs: a NaN or inf in ``k`` at a key that a row does not attend never reaches
    that row (its score is masked before the softmax). In ``v``, a key that is in no range tile
    and no column list of its (batch, head) is never read and cannot reach the output. A key the
    row does not attend but that is read beside attended ones (the Triton kernel: inside a
    computed tile, e.g. above the diagonal; the reference: any key another row of the head
    attends) may turn the row NaN (``0 * NaN`` in ``P @ V``), as in torch SDPA.
    """
    B, H, _, S_Q, S_KV, D = check_qkv(q, k, v)
    _check_blocks(block_m, block_n, _OP)
    if S_Q != S_KV:
        raise NotImplementedError(
            f"{_OP}: only self-attention prefill (S_Q == S_KV) is supported, got S_Q={S_Q}, "
            f"S_KV={S_KV}"
        )
    scale = check_scale(scale, D)
    check_indices = check_bool(check_indices, "check_indices", _OP)
    which = resolve_impl(
        impl, q.device, _OP, like=q, variant=(block_m, block_n),
        fa4=lambda: block_lists_problem(q, block_size=(block_m, block_n), causal=True, S_KV=S_KV),
    )  # fmt: skip
    for nm, t, n in (("vertical_indices", vertical_indices, "NV"),
                     ("slash_indices", slash_indices, "NS")):  # fmt: skip
        check_index_tensor(
            t, nm, op=_OP, dims=(("B", B), ("H", H), (n, None)), device=q.device,
            dtypes=(torch.int32, torch.int64),
        )  # fmt: skip
    if index is not None:
        _check_prebuilt(index, B, H, S_Q, block_m, block_n, q.device, check_indices)
    if which == "reference" or index is not None:
        if check_indices:
            # The reference reads the indices themselves.
            _check_indices(vertical_indices, "vertical_indices", B, H, S_Q)
            _check_indices(slash_indices, "slash_indices", B, H, S_Q)
    else:
        index = build_vertical_slash_index(
            vertical_indices, slash_indices, seq_len=S_Q, block_m=block_m, block_n=block_n,
            check_contents=check_indices, impl="triton",
        )  # fmt: skip
    if which == "reference":
        return vertical_slash_attention_reference(
            q, k, v, vertical_indices, slash_indices,
            scale=scale, block_m=block_m, block_n=block_n,
        )  # fmt: skip
    check_triton_head_dim(D, _OP)
    if which == "fa4":
        from ..fa4.vertical_slash import vertical_slash

        return vertical_slash(q, k, v, index, scale=scale)
    from .triton import _launch_vertical_slash_fwd

    out, lse = _launch_vertical_slash_fwd(q, k, v, index, scale=scale)
    return AttentionOutput(out, lse)
