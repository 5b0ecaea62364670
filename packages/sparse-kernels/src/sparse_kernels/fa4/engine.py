"""Our ``[B, H, S, D]`` attention ops run by FlashAttention-4's kernels (``flash_attn.cute``).

FA4 takes ``[B, S, H, D]``: the ``transpose(1, 2)`` views of our tensors are passed as they are
(FA4 reads any strides whose last one is 1), so no copy is made on the way in; the output comes
back as the ``[B, H, S, D]`` view of FA4's ``[B, S, H, D]`` buffer. Our block lists are already
FA4's layout (FlexAttention's ``BlockMask`` lists): they are handed over as views, cut to the
key-block count FA4 accepts, and copied only when their last dim is strided.

Callers check :func:`sparse_kernels.fa4.support.problem` first; this module assumes it passed.
FA4's entry point is an autograd function; it runs here without autograd, so that every engine
is forward-only alike and no layer keeps its inputs alive for a backward that is never run.
"""

from __future__ import annotations

import torch

from .._types import AttentionOutput


def _bshd(t: torch.Tensor) -> torch.Tensor:
    return t.transpose(1, 2)


def _fa4_list(t: torch.Tensor | None, width: int | None = None) -> torch.Tensor | None:
    """A list as FA4 takes it: at most ``width`` entries (our checked lists hold each of the
    ``width`` key blocks at most once, so nothing listed is cut) and a contiguous last dim."""
    if t is None:
        return None
    if width is not None and t.shape[-1] > width:
        t = t[..., :width]
    return t if t.stride(-1) == 1 else t.contiguous()


def dense(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool, scale: float
) -> AttentionOutput:
    """FA4 dense attention. Causal alignment is bottom-right, as ours (DESIGN.md)."""
    from flash_attn.cute import flash_attn_func

    with torch.no_grad():
        out, lse = flash_attn_func(
            _bshd(q), _bshd(k), _bshd(v), softmax_scale=scale, causal=causal, return_lse=True
        )
    return AttentionOutput(out.transpose(1, 2), lse)


def block_sparse(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    lists: tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor | None],
    *,
    block_size: tuple[int, int],
    causal: bool,
    scale: float,
) -> AttentionOutput:
    """FA4 over block lists ``(kv_num_blocks, kv_indices, full_kv_num_blocks, full_kv_indices)``
    (int32, ``[B', H', NQB(, W)]``). Partial and full lists are attended alike, with the causal
    rule applied in every listed tile when ``causal`` (FA4 masks the diagonal by position, which
    is a no-op on tiles below it)."""
    from flash_attn.cute import flash_attn_func
    from flash_attn.cute.block_sparsity import BlockSparseTensorsTorch

    num, idx, full_num, full_idx = lists
    nkb = -(-k.shape[2] // block_size[1])
    if full_num is None:
        # FA4's sm90 kernel walks both lists: no full blocks is an empty one, not None.
        full_num = torch.zeros_like(num)
        full_idx = torch.zeros((*num.shape, 1), dtype=torch.int32, device=num.device)
    tensors = BlockSparseTensorsTorch(
        mask_block_cnt=_fa4_list(num),
        mask_block_idx=_fa4_list(idx, nkb),
        full_block_cnt=_fa4_list(full_num),
        full_block_idx=_fa4_list(full_idx, nkb),
        block_size=block_size,
    )
    with torch.no_grad():
        out, lse = flash_attn_func(
            _bshd(q), _bshd(k), _bshd(v),
            softmax_scale=scale, causal=causal, block_sparse_tensors=tensors, return_lse=True,
        )  # fmt: skip
    return AttentionOutput(out.transpose(1, 2), lse)
