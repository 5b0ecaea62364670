"""Public block-sparse attention op over a FlexAttention ``BlockMask``."""

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
from .reference import block_sparse_attention_reference

_OP = "block_sparse_attention"
SUPPORTED_BLOCK_SIZES = (64, 128)


def _check_lists(
    name: str,
    num: torch.Tensor,
    idx: torch.Tensor,
    B: int,
    H: int,
    nqb: int,
    nkb: int,
    device: torch.device,
    check_indices: bool,
) -> None:
    inum, iidx = f"block_mask.{name}num_blocks", f"block_mask.{name}indices"
    bdim, hdim = ("B'", (1, B) if B != 1 else 1), ("H'", (1, H) if H != 1 else 1)
    num = check_index_tensor(
        num, inum, op=_OP, dims=(bdim, hdim, ("ceil(S_Q/BLOCK_M)", nqb)), device=device
    )  # fmt: skip
    Bm, Hm = num.shape[:2]
    idx_dims = (("B'", Bm), ("H'", Hm), ("ceil(S_Q/BLOCK_M)", nqb), ("W", None))
    idx = check_index_tensor(idx, iidx, op=_OP, dims=idx_dims, device=device)
    if not check_indices:
        return
    W = idx.shape[-1]
    check_index_range(num, inum, 0, W + 1, op=_OP, what=f"counts (at most the width W={W})")
    listed = torch.arange(W, device=idx.device) < num[..., None]
    check_index_range(
        idx, iidx, 0, nkb, op=_OP, listed=listed,
        what=f"listed kv blocks (ceil(S_KV / BLOCK_N) = {nkb} blocks)",
    )  # fmt: skip


def _check_no_duplicates(bm, nkb: int) -> None:
    lists = [(bm.kv_num_blocks, bm.kv_indices)]
    if bm.full_kv_num_blocks is not None:
        lists.append((bm.full_kv_num_blocks, bm.full_kv_indices))
    shape = torch.broadcast_shapes(*(n.shape for n, _ in lists))
    count = torch.zeros(*shape, nkb + 1, dtype=torch.int32, device=bm.kv_indices.device)
    for num, idx in lists:
        take = torch.arange(idx.shape[-1], device=idx.device) < num[..., None]
        dst = torch.where(take, idx.to(torch.int64), nkb).expand(*shape, idx.shape[-1])
        count.scatter_add_(-1, dst, torch.ones_like(dst, dtype=torch.int32))
    dup = count[..., :nkb] > 1
    if bool(dup.any()):
        b, h, m, n = (int(x) for x in dup.nonzero()[0])
        raise ValueError(
            f"{_OP}: a kv block is listed twice for one query block (within a list or in both "
            f"the partial and the full list); each block may be listed once, got kv block {n} "
            f"listed {int(count[b, h, m, n])} times for query block {m} (batch {b}, head {h} of "
            f"the broadcast lists)"
        )


def block_sparse_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    block_mask,
    *,
    causal: bool = True,
    scale: float | None = None,
    impl: str = "auto",
    check_indices: bool = True,
) -> AttentionOutput:
    """Block-sparse flash attention over a FlexAttention ``BlockMask``.

    Attended set: query ``i`` attends key ``j`` iff the block ``(i // BLOCK_M, j // BLOCK_N)`` is
    listed for it (the first ``kv_num_blocks`` entries of ``kv_indices``, "partial", or the first
    ``full_kv_num_blocks`` entries of ``full_kv_indices``, "full") and, if ``causal``, ``j`` is
    causally visible: row ``i`` sits at position ``i + S_KV - S_Q`` (DESIGN.md) and sees
    ``j <= i + S_KV - S_Q``. The mask's ``mask_mod`` is NOT evaluated, so partial and full blocks
    are attended alike; the kernel applies an element mask only where the causal diagonal or the
    key bound crosses a tile. A row that attends nothing gets ``out = 0``, ``lse = -inf``.
    :func:`sparse_kernels.block_sparse.block_mask_to_dense` gives this set as a dense bool mask.

    Args:
        q: ``[B, H, S_Q, D]``; k, v: ``[B, H_KV, S_KV, D]``, ``H % H_KV == 0`` (GQA native).
        block_mask: ``torch.nn.attention.flex_attention.BlockMask`` (``create_block_mask`` or
            ``BlockMask.from_kv_blocks``), on q's device. ``BLOCK_SIZE`` ``(BLOCK_M, BLOCK_N)``
            each 64 or 128 (they may differ). ``kv_num_blocks`` ``[B', H', ceil(S_Q/BLOCK_M)]``
            with ``B'`` in ``{1, B}`` and ``H'`` in ``{1, H}`` (size 1 broadcasts: one mask for
            every batch entry / head), ``kv_indices`` ``[B', H', ceil(S_Q/BLOCK_M), W]``; int32.
            Listed indices must lie in ``[0, ceil(S_KV/BLOCK_N))``, each block listed at most
            once per query block. The mask's ``seq_lengths`` are not used (q/k give them).
            Any strides (lists whose last dim is not contiguous are copied before the launch).
        causal: apply the causal rule above on top of the listed blocks.
        scale: softmax scale, finite and positive; default ``D ** -0.5``.
        impl: ``"triton"`` (CUDA, or CPU under ``TRITON_INTERPRET=1``), ``"fa4"``
            (FlashAttention-4's block-sparse kernel, the ``hopper`` extra: fp16/bf16 on an sm90
            GPU, head dims 8..128 in steps of 8, block sizes 64 or 128, and without ``causal``
            ``S_KV`` a multiple of ``BLOCK_N``; anything else raises, naming why; the lists go to
            FA4 as they are), ``"reference"`` (dense PyTorch over the expanded mask, scores and
            softmax in float32) or ``"auto"`` (on CUDA, FA4 where
            :data:`sparse_kernels.fa4.AUTO_FA4` lists this op for the GPU and block size and FA4
            can run the input, else triton; the reference elsewhere).
        check_indices: verify counts are within the lists' width and listed indices are in
            range and not duplicated (reduced on the device, then up to five host reads); pass
            ``False`` only for a mask already checked or built valid (timed loops): unchecked
            bad lists are undefined behaviour. Shapes, dtypes and devices are checked either way.

    Returns:
        ``AttentionOutput(out, lse)``.

    Non-finite inputs: a NaN or inf in ``k`` at a key that a row does not attend never reaches
    that row (its score is masked before the softmax). In ``v``, a kv block listed for no query
    block of its (batch, head) is never read and cannot reach the output. A key inside a block
    that is read but that the row does not attend (above the causal diagonal in a listed block;
    in the reference, any key another row of the head attends) may turn the row NaN
    (``0 * NaN`` in ``P @ V``), as in torch SDPA.
    """
    B, H, _, S_Q, S_KV, D = check_qkv(q, k, v)
    scale = check_scale(scale, D)
    causal = check_bool(causal, "causal", _OP)
    check_indices = check_bool(check_indices, "check_indices", _OP)
    bs = getattr(block_mask, "BLOCK_SIZE", None)
    if bs is None or not hasattr(block_mask, "kv_num_blocks"):
        raise TypeError(
            f"{_OP}: block_mask: expected a flex_attention BlockMask, got {type(block_mask).__name__}"
        )
    BM, BN = (bs, bs) if isinstance(bs, int) else tuple(int(x) for x in bs)
    if BM not in SUPPORTED_BLOCK_SIZES or BN not in SUPPORTED_BLOCK_SIZES:
        raise NotImplementedError(
            f"{_OP}: BLOCK_SIZE {SUPPORTED_BLOCK_SIZES} per side is supported, got ({BM}, {BN})"
        )
    nqb, nkb = -(-S_Q // BM), -(-S_KV // BN)
    _check_lists("kv_", block_mask.kv_num_blocks, block_mask.kv_indices, B, H, nqb, nkb,
                 q.device, check_indices)  # fmt: skip
    if (block_mask.full_kv_num_blocks is None) != (block_mask.full_kv_indices is None):
        raise ValueError(f"{_OP}: block_mask has only one of full_kv_num_blocks/full_kv_indices")
    if block_mask.full_kv_num_blocks is not None:
        _check_lists("full_kv_", block_mask.full_kv_num_blocks, block_mask.full_kv_indices,
                     B, H, nqb, nkb, q.device, check_indices)  # fmt: skip
    if check_indices:
        _check_no_duplicates(block_mask, nkb)
    which = resolve_impl(
        impl, q.device, _OP,
        fa4=lambda: block_lists_problem(q, block_size=(BM, BN), causal=causal, S_KV=S_KV),
        like=q, variant=(BM, BN),
    )  # fmt: skip
    if which == "reference":
        return block_sparse_attention_reference(q, k, v, block_mask, causal=causal, scale=scale)
    lists = (block_mask.kv_num_blocks, block_mask.kv_indices,
             block_mask.full_kv_num_blocks, block_mask.full_kv_indices)  # fmt: skip
    if which == "fa4":
        from ..fa4.engine import block_sparse

        return block_sparse(q, k, v, lists, block_size=(BM, BN), causal=causal, scale=scale)
    check_triton_head_dim(D, _OP)
    from .triton import _launch_block_sparse_fwd

    out, lse = _launch_block_sparse_fwd(
        q, k, v, *lists, block_m=BM, block_n=BN, causal=causal, scale=scale
    )
    return AttentionOutput(out, lse)
