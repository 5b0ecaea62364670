"""Public permuted block-sparse attention op (Grid, Q-Boundary and 2D-Boundary heads)."""

from __future__ import annotations

import torch

from .._types import AttentionOutput
from .._validate import check_bool, check_qkv, check_scale, check_triton_head_dim, resolve_impl
from . import checks
from .reference import permuted_block_sparse_attention_reference

_OP = "permuted_block_sparse_attention"
_INT_DTYPES = (torch.int32, torch.int64)
# Block sizes the Triton kernel takes (powers of two: they are tile extents).
TRITON_BLOCK_SIZES = (16, 32, 64, 128, 256)


def _check_block(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name}: expected an int, got {type(value).__name__}")
    if value < 1:
        raise ValueError(f"{name}: expected an int >= 1, got {value}")
    return value


def _check_int_tensor(t: object, name: str, device: torch.device) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in _INT_DTYPES:
        raise TypeError(f"{name}: expected dtype int32 or int64, got {t.dtype}")
    if t.device != device:
        raise ValueError(f"{name}: expected a tensor on {device} (q's device), got {t.device}")
    return t


def _check_perm(
    perm: torch.Tensor | None, name: str, B: int, heads: tuple[int, ...], S: int, device
) -> None:
    if perm is None:
        return
    _check_int_tensor(perm, name, device)
    ok = (
        (perm.ndim == 1 and perm.shape[0] == S)
        or (perm.ndim == 2 and perm.shape[0] in heads and perm.shape[1] == S)
        or (
            perm.ndim == 3
            and perm.shape[0] in (1, B)
            and perm.shape[1] in heads
            and perm.shape[2] == S
        )
    )
    if not ok:
        hs = " or ".join(str(h) for h in sorted(set(heads)))
        raise ValueError(
            f"{name}: expected shape [{S}], [{hs}, {S}] or [{B} or 1, {hs}, {S}], "
            f"got {tuple(perm.shape)}"
        )


def _check_blocks(
    indices: torch.Tensor,
    counts: torch.Tensor,
    prefix: str,
    B: int,
    H: int,
    nqb: int,
    device,
    names: tuple[str, str] | None = None,
) -> None:
    iname, cname = names or (f"{prefix}kv_block_indices", f"{prefix}kv_block_counts")
    _check_int_tensor(indices, iname, device)
    _check_int_tensor(counts, cname, device)
    if (
        indices.ndim != 4
        or indices.shape[0] not in (1, B)
        or indices.shape[1] not in (1, H)
        or indices.shape[2] != nqb
    ):
        raise ValueError(
            f"{iname}: expected shape [{B} or 1, {H} or 1, NQB={nqb}, MAXB], "
            f"got {tuple(indices.shape)}"
        )
    want = (indices.shape[0], indices.shape[1], nqb)
    if tuple(counts.shape) != want:
        raise ValueError(
            f"{cname}: expected shape {list(want)} (matching the indices), "
            f"got {tuple(counts.shape)}"
        )


def _check_modality(t: object, name: str, B: int, S: int, device) -> None:
    _check_int_tensor(t, name, device)
    ok = (t.ndim == 1 and t.shape[0] == S) or (
        t.ndim == 2 and t.shape[0] in (1, B) and t.shape[1] == S
    )
    if not ok:
        raise ValueError(f"{name}: expected shape [{S}] or [{B} or 1, {S}], got {tuple(t.shape)}")


def _content_checks(
    q_perm, kv_perm, lists, nkb: int, modalities, runs, run_step, S_KV: int
) -> list[checks.Check]:
    """The content checks of every index argument (see ``check_perm``), not yet read back."""
    out = [checks.modality_check(mod, name) for name, mod in modalities]
    for name, perm in (("q_perm", q_perm), ("kv_perm", kv_perm)):
        if perm is not None:
            out += checks.perm_check(perm, name)
    listed = []
    for prefix, idx, cnt in lists:
        names = (f"{prefix}kv_block_indices", f"{prefix}kv_block_counts", "MAXB")
        found, mask = checks.counted_checks(idx, cnt, names, "listed key blocks", nkb)
        out += found
        listed.append((idx, mask))
    # A key block listed twice for one query block (in one list, or in both) would be summed
    # twice by the kernel.
    out.append(checks.unique_blocks_check(listed))
    if runs is not None:
        names = ("kv_run_starts", "kv_run_counts", "MAXR")
        found, _ = checks.counted_checks(*runs, names, "original key positions", S_KV)
        out += found
        if isinstance(run_step, torch.Tensor):
            out.append(checks.range_check(run_step, "kv_run_step", 1, None, "steps >= 1"))
    return out


def _check_run_step(step: object, B: int, H: int, device) -> int | torch.Tensor:
    """``kv_run_step``, checked: an int >= 1 as is (the kernel compiles a step of 1 in), a tensor
    as int64 ``[B|1, H|1]``."""
    if isinstance(step, bool) or not isinstance(step, (int, torch.Tensor)):
        raise TypeError(f"kv_run_step: expected an int or an int tensor, got {type(step).__name__}")
    if isinstance(step, int):
        if step < 1:
            raise ValueError(f"kv_run_step: expected an int >= 1, got {step}")
        return step
    _check_int_tensor(step, "kv_run_step", device)
    if step.ndim != 2 or step.shape[0] not in (1, B) or step.shape[1] not in (1, H):
        raise ValueError(
            f"kv_run_step: expected shape [{B} or 1, {H} or 1], got {tuple(step.shape)}"
        )
    return step.to(torch.int64)


def permuted_block_sparse_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    kv_block_indices: torch.Tensor,
    kv_block_counts: torch.Tensor,
    q_perm: torch.Tensor | None = None,
    kv_perm: torch.Tensor | None = None,
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
    check_perm: bool = True,
    impl: str = "auto",
) -> AttentionOutput:
    """Block-sparse attention in PERMUTED row/column order, read and written through indices.

    The kernel under MMInference's Grid, Q-Boundary and 2D-Boundary heads. Rows and columns are
    reordered inside the kernel by index-driven loads and stores; no permuted copy of q, k, v or
    the output is ever made, and the result comes back in ORIGINAL order.

    Semantics. Permuted query row ``r`` is original row ``q_perm[r]``; permuted key column ``c``
    is original key ``kv_perm[c]``. Row ``r`` attends column ``c`` iff the block
    ``(r // block_m, c // block_n)`` is listed for that (batch, head) and

    * it is in the partial list (``kv_block_indices``) and, if ``causal``, the ORIGINAL key
      ``j = kv_perm[c]`` is visible from the ORIGINAL query position:
      ``j <= q_perm[r] + S_KV - S_Q`` (DESIGN.md alignment); or
    * it is in the full list (``full_kv_block_indices``): no element mask at all (as
      FlexAttention's full blocks; the caller promises every pair there is wanted, causal or not).

    Per-pair masks (2D-Boundary, optional: ``q_modality``, ``kv_modality`` and ``kv_block_pairs``
    together): a partial-list entry additionally keeps only the (row, column) pairs whose
    modality pair it allows: bit ``q_modality[q_perm[r]] * 8 + kv_modality[kv_perm[c]]`` of its
    int64 ``kv_block_pairs`` value (``sparse_kernels.permuted.pair_bit(a, b)``). A block that straddles a
    modality boundary in permuted order is then exact: each modality pair gets only its own
    pattern there. Full-list entries take no pair mask.

    Run list (optional: ``kv_run_starts`` and ``kv_run_counts`` together): entries are ORIGINAL
    key positions ``s``; permuted query block ``m`` attends the ``block_n`` original keys
    ``s, s + d, ..., s + (block_n - 1) * d`` below ``S_KV`` (``d = kv_run_step`` of the head),
    under the same causal rule as the partial list. A listed key block whose keys form such a
    progression (with ``d = 1``: every block of an identity order and of a modality order that
    does not cross a segment end; with ``d`` = the grid stride: every block inside one grid
    line) can go here instead of in ``kv_block_indices``: the kernel then computes the tile's
    key positions instead of reading the key permutation (the indirection costs about 30% at
    128K on an H100, ``results/boundary/boundary-gather-cost-H100-2026-11-23.json``).
    :func:`~sparse_kernels.permuted.split_run_blocks` makes the split. Runs take no pair mask.

    Because causality is evaluated on original positions, a causal Grid head stays exact after
    the permutation. ``out[b, h, i]`` and ``lse[b, h, i]`` are for ORIGINAL row ``i``. A row that
    attends nothing gets ``out = 0`` and ``lse = -inf``.

    Args:
        q: ``[B, H, S_Q, D]``; k, v: ``[B, H_KV, S_KV, D]``, ``H % H_KV == 0`` (GQA is native, K/V
            are never repeated). fp16, bf16 or fp32.
        kv_block_indices: int32/int64 ``[B or 1, H or 1, NQB, MAXB]``, ``NQB = ceil(S_Q / block_m)``:
            for each PERMUTED query block, PERMUTED key block numbers in ``[0, ceil(S_KV / block_n))``;
            only the first ``kv_block_counts[..., m]`` entries are read (any order, each at most once).
        kv_block_counts: int32/int64 ``[B or 1, H or 1, NQB]`` (the same leading dims as the indices).
        q_perm: int32/int64 ``[S_Q]`` (shared), ``[H or 1, S_Q]`` (per head, shared over the
            batch: what :func:`grid_permutation` returns) or ``[B or 1, H or 1, S_Q]``;
            None = identity.
        kv_perm: int32/int64 ``[S_KV]``, ``[H_KV or H or 1, S_KV]`` or
            ``[B or 1, H_KV or H or 1, S_KV]``: per KV head, or per
            QUERY head (a query head of a GQA group may order the shared K/V its own way: the
            kernel gathers, so it costs nothing extra); None = identity.
        full_kv_block_indices, full_kv_block_counts: optional second list (both or neither),
            same shapes; disjoint from the partial list.
        block_m, block_n: block sizes of the block structure (the Triton kernel takes powers of
            two 16..256; its tiles divide them; the reference takes any positive size).
        causal: evaluate causality on original positions for partial blocks.
        q_modality, kv_modality: int32/int64 ``[S]`` or ``[B or 1, S]`` modality id (0..7) of each
            ORIGINAL query / key token.
        kv_block_pairs: int64 (or int32) pair masks, the shape of ``kv_block_indices``: entry
            ``[b, h, m, t]`` is the set of allowed (query, key) modality pairs of that listed block.
        kv_run_starts: int32/int64 ``[B or 1, H or 1, NQB, MAXR]`` original start positions in
            ``[0, S_KV)``; kv_run_counts: ``[B or 1, H or 1, NQB]``, as for the block lists. The
            caller keeps each key in at most one list (``check_perm`` checks the ranges only).
        kv_run_step: the runs' step, ``>= 1``: an int or an int tensor ``[B or 1, H or 1]``.
        scale: softmax scale, default ``D ** -0.5``.
        check_perm: check the index contents on every impl (on by default): the permutations
            are permutations of ``0..S-1``, modality ids in ``[0, 8)``, counts in ``[0, MAXB]``
            (``[0, MAXR]`` for runs), listed blocks in ``[0, ceil(S_KV / block_n))``, run
            starts in ``[0, S_KV)``, run steps ``>= 1``, and no key block listed twice for one
            query block (within a list or across the two lists). The checks run on the tensors'
            device (a scatter per permutation row, a sort per query block's lists) and read
            back one flag vector: one host synchronisation per call. ``False`` is for callers
            that built the inputs with this library's planners (``sparse_patterns``' plans
            pass it, keeping their hot path free of host syncs). With it, invalid contents
            are undefined behaviour: the Triton kernel bounds counts, ``q_perm`` entries and run
            steps itself, but an out-of-range block number, run start or ``kv_perm`` entry may
            make it read out of bounds (a crash). Shapes, dtypes and devices are checked either
            way.
        impl: ``"triton"``, ``"reference"`` or ``"auto"`` (triton on CUDA, reference elsewhere).

    Returns:
        ``AttentionOutput(out, lse)`` in original row order.
    """
    B, H, H_KV, S_Q, S_KV, D = check_qkv(q, k, v)
    scale = check_scale(scale, D)
    causal = check_bool(causal, "causal", _OP)
    block_m = _check_block("block_m", block_m)
    block_n = _check_block("block_n", block_n)
    nqb, nkb = -(-S_Q // block_m), -(-S_KV // block_n)
    dev = q.device
    _check_perm(q_perm, "q_perm", B, (1, H), S_Q, dev)
    _check_perm(kv_perm, "kv_perm", B, (1, H_KV, H), S_KV, dev)
    _check_blocks(kv_block_indices, kv_block_counts, "", B, H, nqb, dev)
    if (full_kv_block_indices is None) != (full_kv_block_counts is None):
        raise ValueError(
            "full_kv_block_indices and full_kv_block_counts: expected both or neither, got "
            f"indices={'None' if full_kv_block_indices is None else 'a tensor'}, "
            f"counts={'None' if full_kv_block_counts is None else 'a tensor'}"
        )
    perms_given = (q_perm, kv_perm)
    # One layout for both paths: [B|1, heads|1, S].
    if q_perm is not None and q_perm.ndim < 3:
        q_perm = q_perm.reshape(1, -1, S_Q)
    if kv_perm is not None and kv_perm.ndim < 3:
        kv_perm = kv_perm.reshape(1, -1, S_KV)
    lists = [("", kv_block_indices, kv_block_counts)]
    if full_kv_block_indices is not None:
        _check_blocks(full_kv_block_indices, full_kv_block_counts, "full_", B, H, nqb, dev)
        lists.append(("full_", full_kv_block_indices, full_kv_block_counts))
    pair_args = (q_modality, kv_modality, kv_block_pairs)
    modalities = []
    if any(x is not None for x in pair_args):
        if any(x is None for x in pair_args):
            got = ", ".join(
                f"{n}={'None' if x is None else 'a tensor'}"
                for n, x in zip(("q_modality", "kv_modality", "kv_block_pairs"), pair_args)
            )
            raise ValueError(
                f"q_modality, kv_modality and kv_block_pairs: expected all three or none, got {got}"
            )
        _check_modality(q_modality, "q_modality", B, S_Q, dev)
        _check_modality(kv_modality, "kv_modality", B, S_KV, dev)
        _check_int_tensor(kv_block_pairs, "kv_block_pairs", dev)
        if kv_block_pairs.shape != kv_block_indices.shape:
            raise ValueError(
                f"kv_block_pairs: expected the shape of kv_block_indices "
                f"{tuple(kv_block_indices.shape)}, got {tuple(kv_block_pairs.shape)}"
            )
        modalities = [("q_modality", q_modality), ("kv_modality", kv_modality)]
    if (kv_run_starts is None) != (kv_run_counts is None):
        raise ValueError(
            "kv_run_starts and kv_run_counts: expected both or neither, got "
            f"starts={'None' if kv_run_starts is None else 'a tensor'}, "
            f"counts={'None' if kv_run_counts is None else 'a tensor'}"
        )
    kv_run_step = _check_run_step(kv_run_step, B, H, dev)
    if kv_run_starts is not None:
        _check_blocks(
            kv_run_starts, kv_run_counts, "", B, H, nqb, dev, ("kv_run_starts", "kv_run_counts")
        )
        if kv_block_pairs is not None:
            raise NotImplementedError(
                f"{_OP}: a run list (kv_run_starts) takes no pair masks; got kv_block_pairs too "
                f"(keep the blocks that need pair masks in kv_block_indices)"
            )
    which = resolve_impl(impl, dev, _OP)
    if not isinstance(check_perm, bool):
        raise TypeError(f"check_perm: expected a bool, got {type(check_perm).__name__}")
    if check_perm:
        runs = None if kv_run_starts is None else (kv_run_starts, kv_run_counts)
        found = _content_checks(*perms_given, lists, nkb, modalities, runs, kv_run_step, S_KV)
        checks.raise_first(found)
    kw = dict(
        q_perm=q_perm,
        kv_perm=kv_perm,
        kv_block_indices=kv_block_indices,
        kv_block_counts=kv_block_counts,
        full_kv_block_indices=full_kv_block_indices,
        full_kv_block_counts=full_kv_block_counts,
        block_m=block_m,
        block_n=block_n,
        causal=bool(causal),
        scale=scale,
        q_modality=q_modality,
        kv_modality=kv_modality,
        kv_block_pairs=kv_block_pairs,
        kv_run_starts=kv_run_starts,
        kv_run_counts=kv_run_counts,
        kv_run_step=kv_run_step,
    )
    if which == "reference":
        return permuted_block_sparse_attention_reference(q, k, v, **kw)
    check_triton_head_dim(D, _OP)
    for name, b in (("block_m", block_m), ("block_n", block_n)):
        if b not in TRITON_BLOCK_SIZES:
            raise NotImplementedError(
                f"{_OP}: the Triton kernel supports {name} in {TRITON_BLOCK_SIZES}, got {b} "
                f"(impl='reference' takes any block size)"
            )
    from .triton import _launch_permuted_fwd

    out, lse = _launch_permuted_fwd(q, k, v, **kw)
    return AttentionOutput(out, lse)
