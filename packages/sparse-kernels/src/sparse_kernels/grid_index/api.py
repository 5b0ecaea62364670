"""Public entry of the Grid index: stride and phase search, permutation and block lists of Grid
heads (MMInference's Grid pattern) from the last query rows."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from .._validate import (
    TRITON_MAX_HEAD_DIM,
    check_qkv,
    check_scale,
    resolve_impl,
)
from ..estimate.reference import line_folds_reference
from ..estimate.search import search_folds_reference
from ..permuted.perms import grid_line_offsets, grid_permutation, split_run_blocks
from .indexer import GridIndexer, _head_pairs
from .lists import grid_lists
from .reference import grid_block_lines, grid_block_runs, grid_window
from .settings import DEFAULT_SETTINGS, GridIndexSettings
from .types import GridIndex, RunSplit


def grid_index(
    q: torch.Tensor,
    k: torch.Tensor,
    *,
    strides: Sequence[int],
    last_q: int,
    block: int,
    use_vline: bool | Sequence[bool] = True,
    use_slash: bool | Sequence[bool] = True,
    scale: float | None = None,
    rel_tol: float = 0.15,
    settings: GridIndexSettings = DEFAULT_SETTINGS,
    impl: str = "auto",
) -> GridIndex:
    """The sparse index of Grid heads: each head's stride and phase, its permutation and the
    block lists of its permuted order, from the last ``last_q`` query rows.

    Steps (each with a PyTorch oracle in :mod:`sparse_kernels.grid_index.reference`):
    (1) the rows' attention mass per key column and per diagonal, over the whole periods
    ``[P, S // P * P)`` of ``P = lcm(strides)``, summed per residue modulo ``P``
    (:func:`~sparse_kernels.estimate.line_folds`); (2) MMInference Algorithm 1 on those folds:
    the smallest stride scoring within ``rel_tol`` of the best, its phase the best column class
    (:func:`~sparse_kernels.estimate.search.search_folds_reference`); (3) the Grid permutation
    of each head (:func:`~sparse_kernels.grid_permutation`) and per block its run start;
    (4) the block lists of :func:`~sparse_kernels.grid_index.grid_lists` and their run split.

    Args:
        q: ``[B, H, S, D]``; k: ``[B, H_KV, S, D]`` (prefill: ``S_Q == S_KV``), same dtype and
            device; GQA by grouping.
        strides: the candidate strides, ints ``>= 1``; their least common multiple ``P`` must
            satisfy ``2 * P <= S``.
        last_q: rows the search reads (the last ``min(last_q, S)``), at most 128.
        block: block size of the lists (query and key blocks).
        use_vline, use_slash: whether the lists hold vertical line 0 and each block's own
            lines; a bool for every head or ``H`` bools.
        scale: softmax scale (default ``D ** -0.5``).
        rel_tol: ``0 <= rel_tol < 1``.
        settings: the Triton kernels' launch settings.
        impl: ``"triton"``, ``"reference"`` or ``"auto"`` (triton on CUDA, reference elsewhere).
            Both give the same permutations and lists for the same strides and phases.

    Returns:
        :class:`GridIndex`. Triton: five launches (fold pass, merge, search, block index, and
        the lists after one host read of their width). For many layers of one shape use a
        :class:`GridIndexer`, which keeps that width (the lists are then launched before the
        read) and a CUDA graph of the launches.
    """
    B, H, _, S, S_KV, D = check_qkv(q, k, k)
    if S_KV != S:
        raise NotImplementedError(
            f"grid_index: prefill only (S_Q == S_KV), got S_Q={S}, S_KV={S_KV}"
        )
    strides = _check_strides(strides, S)
    for name, val, top in (("last_q", last_q, 128), ("block", block, None)):
        if isinstance(val, bool) or not isinstance(val, int) or val < 1 or (top and val > top):
            rng = f"in [1, {top}]" if top else ">= 1"
            raise ValueError(f"{name}: expected an int {rng}, got {val!r}")
    pairs = _head_pairs(use_vline, use_slash, H)
    if isinstance(rel_tol, bool) or not isinstance(rel_tol, (int, float)) or not 0 <= rel_tol < 1:
        raise ValueError(f"rel_tol: expected a float in [0, 1), got {rel_tol!r}")
    if not isinstance(settings, GridIndexSettings):
        raise TypeError(f"settings: expected a GridIndexSettings, got {type(settings).__name__}")
    scale = check_scale(scale, D)
    if resolve_impl(impl, q.device, "grid_index") == "reference":
        return grid_index_reference(
            q, k, strides=strides, last_q=last_q, block=block, pairs=pairs, scale=scale,
            rel_tol=rel_tol,
        )  # fmt: skip
    if D > TRITON_MAX_HEAD_DIM:
        raise NotImplementedError(
            f"grid_index: impl='triton' takes head dims up to {TRITON_MAX_HEAD_DIM}, got D={D}; "
            f"use impl='reference'"
        )
    indexer = GridIndexer(graphs="off", settings=settings)
    return indexer.start(
        q, k, strides=strides, last_q=last_q, block=block, use_vline=use_vline,
        use_slash=use_slash, scale=scale, rel_tol=rel_tol,
    ).result()  # fmt: skip


def _check_strides(strides: Sequence[int], S: int) -> tuple[int, ...]:
    if not isinstance(strides, Sequence) or not strides:
        raise ValueError(f"strides: expected a non-empty sequence of ints >= 1, got {strides!r}")
    bad = [s for s in strides if isinstance(s, bool) or not isinstance(s, int) or s < 1]
    if bad:
        raise ValueError(f"strides: expected ints >= 1, got {list(strides)}")
    P = math.lcm(*strides)
    if 2 * P > S:
        raise ValueError(
            f"strides: expected a least common multiple P with 2 * P <= S={S}, got P={P} for "
            f"{list(strides)}"
        )
    return tuple(sorted(set(strides)))


def grid_index_reference(
    q: torch.Tensor,
    k: torch.Tensor,
    *,
    strides: tuple[int, ...],
    last_q: int,
    block: int,
    pairs: tuple[tuple[bool, bool], ...],
    scale: float,
    rel_tol: float,
) -> GridIndex:
    """:func:`grid_index` in PyTorch (inputs checked there; ``pairs``: per head
    ``(use_vline, use_slash)``)."""
    B, H, S, _ = q.shape
    dev = q.device
    n = min(last_q, S)
    P = math.lcm(*strides)
    lo, hi = grid_window(P, S)
    col, sl = line_folds_reference(q[:, :, S - n :], k, S - n, period=P, lo=lo, hi=hi, scale=scale)
    st, ph, _ = search_folds_reference(col, sl, strides, rel_tol=rel_tol)
    N = B * H
    stride, phase = st.reshape(N), ph.reshape(N)
    offs = grid_line_offsets(S, stride, phase, device=dev, max_stride=strides[-1])
    perm = grid_permutation(S, stride, phase, device=dev, offsets=offs, impl="reference").perm
    flags = torch.tensor(pairs, device=dev).T.repeat(1, B)  # [2, N], b-major
    lines = grid_block_lines(offs, N, S, block)
    idx, cnt = grid_lists(perm, offs, flags[0], flags[1], S, block, lines=lines, impl="reference")
    runs = grid_block_runs(perm, offs, S, block, lines=lines)
    nb = -(-S // block)
    bh = lambda t: t.reshape(B, H, *t.shape[1:])  # noqa: E731
    idx, cnt, runs, perm = bh(idx), bh(cnt), bh(runs), bh(perm)
    split = split_run_blocks(
        perm, idx, cnt, block, runs=runs, width=idx.shape[-1], impl="reference"
    )
    return GridIndex(st, ph, perm, runs, idx.reshape(B, H, nb, -1), cnt, RunSplit(*split), block)
