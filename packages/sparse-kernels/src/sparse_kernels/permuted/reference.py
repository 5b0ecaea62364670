"""Plain PyTorch oracle for permuted block-sparse attention.

It never runs attention in permuted order: it builds the exact bool mask in ORIGINAL
coordinates (block lists in permuted space gathered through the inverse permutations, causal
on original positions) and calls ``masked_attention_reference`` on the original q, k, v.
"""

from __future__ import annotations

import torch

from .._types import AttentionOutput
from ..attention.reference import causal_mask, masked_attention_reference
from .perms import inverse_permutation

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


def expand_perm(perm: torch.Tensor | None, B: int, H: int, S: int, device) -> torch.Tensor:
    """A ``[S]``, ``[H|1, S]`` or ``[B|1, H|1, S]`` permutation (None = identity) as int64
    ``[B, H, S]``."""
    if perm is None:
        return torch.arange(S, device=device).expand(B, H, S)
    if perm.ndim < 3:
        perm = perm.reshape(1, -1, S)
    return perm.to(device=device, dtype=torch.int64).expand(B, H, S)


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


def _modality_rows(mod: torch.Tensor, B: int, S: int, device) -> torch.Tensor:
    """A ``[S]`` or ``[B|1, S]`` modality id tensor as int64 ``[B, S]``."""
    return mod.to(device=device, dtype=torch.int64).reshape(-1, S).expand(B, S)


def permuted_mask(
    *,
    B: int,
    H: int,
    H_KV: int,
    S_Q: int,
    S_KV: int,
    q_perm: torch.Tensor | None,
    kv_perm: torch.Tensor | None,
    kv_block_indices: torch.Tensor,
    kv_block_counts: torch.Tensor,
    full_kv_block_indices: torch.Tensor | None = None,
    full_kv_block_counts: torch.Tensor | None = None,
    block_m: int,
    block_n: int,
    causal: bool,
    q_modality: torch.Tensor | None = None,
    kv_modality: torch.Tensor | None = None,
    kv_block_pairs: torch.Tensor | None = None,
    kv_run_starts: torch.Tensor | None = None,
    kv_run_counts: torch.Tensor | None = None,
    kv_run_step: int | torch.Tensor = 1,
    device: torch.device | str = "cpu",
) -> torch.Tensor:
    """``[B, H, S_Q, S_KV]`` bool in ORIGINAL coordinates: what query ``i`` attends.

    Original query ``i`` sits at permuted row ``r = q_inv[i]``, original key ``j`` at permuted
    column ``c = kv_inv[j]``. The pair is attended iff block ``(r // block_m, c // block_n)`` is in
    the full list, or it is in the partial list and (not causal or ``j <= i + S_KV - S_Q``)
    and, with pair masks, bit ``q_modality[i] * 8 + kv_modality[j]`` of the entry's
    ``kv_block_pairs`` value is set. A run-list entry ``s`` of permuted query block ``m`` adds
    the original keys ``s + i * kv_run_step`` (``i < block_n``, below ``S_KV``) for its rows,
    under the same causal rule.
    """
    nqb, nkb = -(-S_Q // block_m), -(-S_KV // block_n)
    # Block of each row / column: indexing by it costs O(S) whatever the block size (a block
    # larger than the sequence is one block), where repeating each block would cost O(block).
    row_block = torch.arange(S_Q, device=device) // block_m
    col_block = torch.arange(S_KV, device=device) // block_n

    def spread(x):
        return x.index_select(2, row_block).index_select(3, col_block)

    def elem(indices, counts):
        bm = block_list_mask(indices.to(device), counts.to(device), nkb)
        return spread(bm.expand(B, H, nqb, nkb))

    qp = expand_perm(q_perm, B, H, S_Q, device)
    if kv_perm is not None and kv_perm.ndim >= 2 and kv_perm.shape[-2] == H_KV and H_KV != H:
        kv_perm = kv_perm.repeat_interleave(H // H_KV, dim=-2)
    kp = expand_perm(kv_perm, B, H, S_KV, device)
    q_inv = inverse_permutation(qp)
    kv_inv = inverse_permutation(kp)

    def to_original(m):
        # rows: original i reads permuted row q_inv[i]; then columns likewise.
        m = torch.gather(m, 2, q_inv[..., None].expand(B, H, S_Q, S_KV))
        return torch.gather(m, 3, kv_inv[:, :, None, :].expand(B, H, S_Q, S_KV))

    mask = to_original(elem(kv_block_indices, kv_block_counts))
    if kv_block_pairs is not None:
        bits = block_list_mask(
            kv_block_indices.to(device),
            kv_block_counts.to(device),
            nkb,
            values=kv_block_pairs.to(device=device, dtype=torch.int64),
        ).expand(B, H, nqb, nkb)
        bits = to_original(spread(bits))
        qm = _modality_rows(q_modality, B, S_Q, device)[:, None, :, None]
        km = _modality_rows(kv_modality, B, S_KV, device)[:, None, None, :]
        mask = mask & (torch.bitwise_right_shift(bits, qm * MAX_MODALITIES + km) & 1).bool()
    if kv_run_starts is not None:
        # Runs are in ORIGINAL key order already: spread each start over its block_n keys.
        st = kv_run_starts.to(device=device, dtype=torch.int64)
        valid = torch.arange(st.shape[-1], device=device) < kv_run_counts.to(device)[..., None]
        step = torch.as_tensor(kv_run_step, dtype=torch.int64, device=device)
        step = step.reshape(1, 1) if step.ndim == 0 else step  # [B|1, H|1]
        # keys s + i * step with i >= S_KV lie past the end (step >= 1)
        steps = torch.arange(min(block_n, S_KV), device=device) * step[:, :, None, None, None]
        keys = st[..., None] + steps  # [.., NQB, MAXR, block_n]
        keys = torch.where(valid[..., None] & (keys < S_KV), keys, S_KV).flatten(-2)
        runs = torch.zeros(*keys.shape[:-1], S_KV + 1, dtype=torch.bool, device=device)
        runs = runs.scatter_(-1, keys, True)[..., :S_KV].expand(B, H, nqb, S_KV)
        runs = runs.index_select(2, row_block)
        mask = mask | torch.gather(runs, 2, q_inv[..., None].expand(B, H, S_Q, S_KV))
    if causal:
        mask = mask & causal_mask(S_Q, S_KV, device)
    if full_kv_block_indices is not None:
        mask = mask | to_original(elem(full_kv_block_indices, full_kv_block_counts))
    return mask


def permuted_block_sparse_attention_reference(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    q_perm: torch.Tensor | None,
    kv_perm: torch.Tensor | None,
    kv_block_indices: torch.Tensor,
    kv_block_counts: torch.Tensor,
    full_kv_block_indices: torch.Tensor | None = None,
    full_kv_block_counts: torch.Tensor | None = None,
    block_m: int = 64,
    block_n: int = 64,
    causal: bool = True,
    q_modality: torch.Tensor | None = None,
    kv_modality: torch.Tensor | None = None,
    kv_block_pairs: torch.Tensor | None = None,
    kv_run_starts: torch.Tensor | None = None,
    kv_run_counts: torch.Tensor | None = None,
    kv_run_step: int | torch.Tensor = 1,
    scale: float | None = None,
    compute_dtype: torch.dtype | None = None,
    row_chunk: int = 2048,
) -> AttentionOutput:
    """Permuted block-sparse attention by an explicit original-coordinate mask (no validation;
    the public op validates). See :func:`permuted_mask` for the attended set. The bool mask is
    built whole; scores are computed ``row_chunk`` original rows at a time.

    ``compute_dtype`` is the precision of the scores, softmax, lse and ``P @ V``, as in
    :func:`~sparse_kernels.attention.masked_attention_reference`: float32 by default (float64
    for float64 inputs), so that an fp16 score above 65504 stays finite."""
    B, H, S_Q, D = q.shape
    H_KV, S_KV = k.shape[1], k.shape[2]
    scale = D**-0.5 if scale is None else scale
    mask = permuted_mask(
        B=B,
        H=H,
        H_KV=H_KV,
        S_Q=S_Q,
        S_KV=S_KV,
        q_perm=q_perm,
        kv_perm=kv_perm,
        kv_block_indices=kv_block_indices,
        kv_block_counts=kv_block_counts,
        full_kv_block_indices=full_kv_block_indices,
        full_kv_block_counts=full_kv_block_counts,
        block_m=block_m,
        block_n=block_n,
        causal=causal,
        q_modality=q_modality,
        kv_modality=kv_modality,
        kv_block_pairs=kv_block_pairs,
        kv_run_starts=kv_run_starts,
        kv_run_counts=kv_run_counts,
        kv_run_step=kv_run_step,
        device=q.device,
    )
    outs, lses = [], []
    for r0 in range(0, S_Q, row_chunk):
        r1 = min(S_Q, r0 + row_chunk)
        part = masked_attention_reference(
            q[:, :, r0:r1], k, v, mask[:, :, r0:r1], scale=scale, compute_dtype=compute_dtype
        )
        outs.append(part.out)
        lses.append(part.lse)
    return AttentionOutput(torch.cat(outs, dim=2), torch.cat(lses, dim=2))
