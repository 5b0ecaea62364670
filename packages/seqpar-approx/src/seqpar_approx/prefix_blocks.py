"""Block selection over a segment's prefix keys (the anchor and the passing blocks).

The prefix keys of a Spava segment precede all of its rows, so the segment's rows attend them
without a causal mask and the query and key lengths differ (``S_Q = S``, ``S_KV = P``). MMInference's
planner plans square prefills only; this step is the prefix's own plan, made with the public
``sparse_kernels.block_sparse_attention`` (which takes ``S_Q != S_KV``):

1. estimate: ``p = softmax(q_last k_prefix^T * scale)`` over the prefix keys, in float32, for the
   segment's last ``min(last_q, S)`` rows of every query head (its KV head under GQA), averaged
   over those rows and summed per key block of ``block`` keys (host order: anchor first; the last
   block may be short);
2. select, per query head: key block 0 (the start of the anchor, the sink that Spava keeps for
   every block) and the ``top_k - 1`` other blocks of largest score (``torch.topk``), sorted;
3. run: every row of the segment attends every key of its head's selected blocks
   (``block_sparse_attention(..., causal=False)``, the same block list for every query block).

A prefix of at most ``top_k`` blocks is attended whole (all of its blocks are selected), by dense
``sparse_kernels.attention``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from sparse_kernels import AttentionOutput, attention, block_sparse_attention

# the tile sizes block_sparse_attention runs
BLOCK_SIZES = (64, 128)


@dataclass(frozen=True)
class PrefixBlocks:
    """Per-head block selection over the prefix keys (module docstring).

    ``top_k``: key blocks each query head attends (>= 1; block 0 is one of them).
    ``last_q``: the segment rows (its last ones) that estimate the selection.
    ``block``: keys per block, and rows per query tile of the kernel (64 or 128).
    """

    top_k: int
    last_q: int = 64
    block: int = 64

    def __post_init__(self) -> None:
        for name in ("top_k", "last_q"):
            val = getattr(self, name)
            if isinstance(val, bool) or not isinstance(val, int) or val < 1:
                raise ValueError(f"PrefixBlocks.{name}: expected an int >= 1, got {val!r}")
        if isinstance(self.block, bool) or self.block not in BLOCK_SIZES:
            raise ValueError(
                f"PrefixBlocks.block: expected one of {BLOCK_SIZES} (block_sparse_attention's "
                f"tiles), got {self.block!r}"
            )

    def num_blocks(self, prefix_len: int) -> int:
        return -(-prefix_len // self.block)

    def select(self, q: torch.Tensor, k_prefix: torch.Tensor, *, scale: float) -> torch.Tensor:
        """The selected key blocks ``[B, H, min(top_k, NB)]`` int64, ascending, of every query
        head (``q [B, H, S, D]``, ``k_prefix [B, H_KV, P, D]``, ``NB = ceil(P / block)``)."""
        B, H, S, D = q.shape
        H_KV, P = k_prefix.shape[1], k_prefix.shape[2]
        nb = self.num_blocks(P)
        if nb <= self.top_k:
            return torch.arange(nb, device=q.device).expand(B, H, nb)
        L = min(self.last_q, S)
        ql = q[:, :, S - L :].float().reshape(B, H_KV, H // H_KV, L, D)
        s = torch.einsum("bkgld,bkpd->bkglp", ql, k_prefix.float()) * scale
        p = torch.softmax(s, dim=-1).mean(dim=3).reshape(B, H, P)
        p = torch.nn.functional.pad(p, (0, nb * self.block - P))
        score = p.reshape(B, H, nb, self.block).sum(dim=-1)
        score[..., 0] = float("inf")
        return torch.topk(score, self.top_k, dim=-1).indices.sort(dim=-1).values

    def row_mask(self, selected: torch.Tensor, num_rows: int, prefix_len: int) -> torch.Tensor:
        """``[B, H, num_rows, prefix_len]`` bool: the prefix keys each row attends."""
        B, H, _ = selected.shape
        key_block = torch.arange(prefix_len, device=selected.device) // self.block
        hit = torch.zeros(
            B, H, self.num_blocks(prefix_len), dtype=torch.bool, device=selected.device
        )
        hit.scatter_(-1, selected, True)
        return hit[..., key_block][:, :, None, :].expand(B, H, num_rows, prefix_len)

    def attend(
        self,
        q: torch.Tensor,
        k_prefix: torch.Tensor,
        v_prefix: torch.Tensor,
        selected: torch.Tensor,
        *,
        scale: float,
        impl: str,
        check_indices: bool = True,
    ) -> AttentionOutput:
        """Every row of ``q`` over the keys of its head's ``selected`` blocks (no causal mask).
        ``check_indices``: ``block_sparse_attention``'s (its host reads); ``False`` only for a
        selection made by :meth:`select`, whose blocks are distinct and in range."""
        from torch.nn.attention.flex_attention import BlockMask

        B, H, S, _ = q.shape
        P = k_prefix.shape[2]
        nb = self.num_blocks(P)
        if selected.shape[-1] == nb:
            return attention(q, k_prefix, v_prefix, causal=False, scale=scale, impl=impl)
        nqb, K = -(-S // self.block), selected.shape[-1]
        mask = BlockMask.from_kv_blocks(
            torch.full((B, H, nqb), K, dtype=torch.int32, device=q.device),
            selected.to(torch.int32)[:, :, None, :].expand(B, H, nqb, K).contiguous(),
            BLOCK_SIZE=self.block,
            seq_lengths=(S, P),
            compute_q_blocks=False,
        )
        return block_sparse_attention(
            q, k_prefix, v_prefix, mask, causal=False, scale=scale, impl=impl,
            check_indices=check_indices,
        )  # fmt: skip
