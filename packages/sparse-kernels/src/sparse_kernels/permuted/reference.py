"""Plain PyTorch oracle for permuted block-sparse attention.

It never runs attention in permuted order: it builds the plan's exact bool mask in ORIGINAL
coordinates (block lists in permuted space gathered through the inverse permutations, causal
on original positions: ``SparsePlan.to_dense``) and calls ``masked_attention_reference`` on the
original q, k, v.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from .._types import AttentionOutput
from ..attention.reference import causal_mask, masked_attention_reference

if TYPE_CHECKING:
    from ..sparse_plan import SparsePlan

# Modality ids are in [0, MAX_MODALITIES); pair (a, b) is bit ``a * MAX_MODALITIES + b`` of an
# int64 pair mask.
MAX_MODALITIES = 8


def pair_bit(q_modality: int, kv_modality: int) -> int:
    """The bit of ``kv_block_pairs`` that allows (query modality, key modality), as the signed
    int64 value it has in the tensor (bit 63, pair (7, 7), is ``-2**63``). OR the bits together."""
    for name, m in (("q_modality", q_modality), ("kv_modality", kv_modality)):
        if not 0 <= m < MAX_MODALITIES:
            raise ValueError(f"{name}: expected a modality id in [0, {MAX_MODALITIES}), got {m}")
    bit = q_modality * MAX_MODALITIES + kv_modality
    return 1 << bit if bit < 63 else -(1 << 63)


def block_list_mask(
    indices: torch.Tensor,
    counts: torch.Tensor,
    n_kv_blocks: int,
    values: torch.Tensor | None = None,
) -> torch.Tensor:
    """``[..., NQB, NKB]``: query block ``m`` lists key block ``n`` among its first
    ``counts[..., m]`` entries of ``indices[..., m, :]``. bool, or with ``values`` (shaped like
    ``indices``) the value of the entry that lists the block (0 where none does)."""
    maxb = indices.shape[-1]
    valid = torch.arange(maxb, device=indices.device) < counts[..., None].long()
    idx = torch.where(valid, indices.long(), n_kv_blocks)
    if values is None:
        out = torch.zeros(*idx.shape[:-1], n_kv_blocks + 1, dtype=torch.bool, device=idx.device)
        out.scatter_(-1, idx, True)
    else:
        shape = torch.broadcast_shapes(idx.shape, values.shape)
        idx = idx.expand(shape)
        out = torch.zeros(*shape[:-1], n_kv_blocks + 1, dtype=values.dtype, device=idx.device)
        out.scatter_(-1, idx, values.expand(shape))
    return out[..., :n_kv_blocks]


def _modality_rows(mod: torch.Tensor, B: int, S: int) -> torch.Tensor:
    """A ``[B'|1, S]`` modality id tensor as int64 ``[B, S]``."""
    return mod.to(torch.int64).expand(B, S)


def dense_mask(plan: SparsePlan, H: int) -> torch.Tensor:
    """``[B', H, S_Q, S_KV]`` bool in ORIGINAL coordinates: what query ``i`` attends under
    ``plan`` (``SparsePlan.to_dense``, which checks ``H``; ``B'`` the plan's batch).

    Original query ``i`` sits at permuted row ``r = q_inv[i]``, original key ``j`` at permuted
    column ``c = kv_inv[j]``. The pair is attended iff block ``(r // block_m, c // block_n)`` is in
    the full list, or it is in the partial list and (not causal or ``j <= i + S_KV - S_Q``)
    and, with pair masks, bit ``q_modality[i] * 8 + kv_modality[j]`` of the entry's
    ``kv_block_pairs`` value is set. A run-list entry ``s`` of permuted query block ``m`` adds
    the original keys ``s + i * kv_run_step`` (``i < block_n``, below ``S_KV``) for its rows,
    under the same causal rule.
    """
    B, (S_Q, S_KV), (block_m, block_n) = plan.batch, plan.seq_lengths, plan.block_size
    device = plan.device
    nqb, nkb = plan.num_q_blocks, plan.num_kv_blocks
    # Block of each row / column: indexing by it costs O(S) whatever the block size (a block
    # larger than the sequence is one block), where repeating each block would cost O(block).
    row_block = torch.arange(S_Q, device=device) // block_m
    col_block = torch.arange(S_KV, device=device) // block_n

    def spread(x):
        return x.index_select(2, row_block).index_select(3, col_block)

    def elem(indices, counts):
        return spread(block_list_mask(indices, counts, nkb).expand(B, H, nqb, nkb))

    def per_head(inv, S):
        # [B'|1, heads|1, S] -> [B, H, S]; fewer heads than H: one per KV head (a group each).
        if inv is None:
            return torch.arange(S, device=device).expand(B, H, S)
        if inv.shape[1] not in (1, H):
            inv = inv.repeat_interleave(H // inv.shape[1], dim=1)
        return inv.long().expand(B, H, S)

    q_inv = per_head(plan.q_inverse, S_Q)
    kv_inv = per_head(plan.kv_inverse, S_KV)

    def to_original(m):
        # rows: original i reads permuted row q_inv[i]; then columns likewise.
        m = torch.gather(m, 2, q_inv[..., None].expand(B, H, S_Q, S_KV))
        return torch.gather(m, 3, kv_inv[:, :, None, :].expand(B, H, S_Q, S_KV))

    mask = to_original(elem(plan.kv_indices, plan.kv_num_blocks))
    if plan.kv_block_pairs is not None:
        bits = block_list_mask(
            plan.kv_indices, plan.kv_num_blocks, nkb, values=plan.kv_block_pairs.long()
        ).expand(B, H, nqb, nkb)
        bits = to_original(spread(bits))
        qm = _modality_rows(plan.q_modality, B, S_Q)[:, None, :, None]
        km = _modality_rows(plan.kv_modality, B, S_KV)[:, None, None, :]
        mask = mask & (torch.bitwise_right_shift(bits, qm * MAX_MODALITIES + km) & 1).bool()
    if plan.kv_run_starts is not None:
        # Runs are in ORIGINAL key order already: spread each start over its block_n keys.
        st = plan.kv_run_starts.long()
        valid = torch.arange(st.shape[-1], device=device) < plan.kv_run_counts[..., None]
        step = torch.as_tensor(plan.kv_run_step, dtype=torch.int64, device=device)
        step = step.reshape(1, 1) if step.ndim == 0 else step  # [B'|1, H'|1]
        # keys s + i * step with i >= S_KV lie past the end (step >= 1)
        steps = torch.arange(min(block_n, S_KV), device=device) * step[:, :, None, None, None]
        keys = st[..., None] + steps  # [.., NQB, R, block_n]
        keys = torch.where(valid[..., None] & (keys < S_KV), keys, S_KV).flatten(-2)
        runs = torch.zeros(*keys.shape[:-1], S_KV + 1, dtype=torch.bool, device=device)
        runs = runs.scatter_(-1, keys, True)[..., :S_KV].expand(B, H, nqb, S_KV)
        runs = runs.index_select(2, row_block)
        mask = mask | torch.gather(runs, 2, q_inv[..., None].expand(B, H, S_Q, S_KV))
    if plan.causal:
        mask = mask & causal_mask(S_Q, S_KV, device)
    if plan.full_kv_indices is not None:
        mask = mask | to_original(elem(plan.full_kv_indices, plan.full_kv_num_blocks))
    return mask


def permuted_block_sparse_attention_reference(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    plan: SparsePlan,
    *,
    scale: float | None = None,
    compute_dtype: torch.dtype | None = None,
    row_chunk: int = 2048,
) -> AttentionOutput:
    """Attention of ``q`` over ``k``/``v`` restricted to ``plan.to_dense()`` (no validation;
    the public op validates). The bool mask is built whole; scores are computed ``row_chunk``
    original rows at a time.

    ``compute_dtype`` is the precision of the scores, softmax, lse and ``P @ V``, as in
    :func:`~sparse_kernels.attention.masked_attention_reference`: float32 by default (float64
    for float64 inputs), so that an fp16 score above 65504 stays finite."""
    S_Q, D = q.shape[2], q.shape[3]
    scale = D**-0.5 if scale is None else scale
    mask = plan.to_dense(heads=q.shape[1])
    outs, lses = [], []
    for r0 in range(0, S_Q, row_chunk):
        r1 = min(S_Q, r0 + row_chunk)
        part = masked_attention_reference(
            q[:, :, r0:r1], k, v, mask[:, :, r0:r1], scale=scale, compute_dtype=compute_dtype
        )
        outs.append(part.out)
        lses.append(part.lse)
    return AttentionOutput(torch.cat(outs, dim=2), torch.cat(lses, dim=2))
