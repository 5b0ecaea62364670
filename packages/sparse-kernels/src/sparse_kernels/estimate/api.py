"""Public entry of the line scores (the estimation step of Vertical-Slash and Grid heads)."""

from __future__ import annotations

import torch

from .._validate import (
    SUPPORTED_DTYPES,
    check_scale,
    check_tensor,
    check_triton_head_dim,
    resolve_impl,
)
from .reference import column_mass_reference, line_folds_reference, line_scores_reference
from .search import search_folds_reference, stride_vector


def line_scores(
    q_rows: torch.Tensor,
    k: torch.Tensor,
    row_start: int,
    *,
    scale: float | None = None,
    impl: str = "auto",
) -> tuple[torch.Tensor, torch.Tensor]:
    """Column and diagonal mass of the approximate attention of ``L`` consecutive query rows.

    Row ``l`` is query position ``r_l = row_start + l``; its distribution is
    ``p[l, j] = softmax_j(q_l . k_j * scale)`` over the causally visible keys ``j <= r_l``.
    Returns float32 ``(vertical, slash)``, each ``[B, H, S]``:
    ``vertical[j] = sum_l p[l, j]`` (mass per key column) and
    ``slash[o] = sum_l p[l, r_l - o]`` (mass per diagonal offset ``o = i - j >= 0``).
    This is what MInference's Vertical-Slash and MMInference's Grid estimators read from the last
    ``last_q`` queries. The Triton path never holds the ``[B, H, L, S]`` matrix: it streams the
    keys twice (row log-sum-exp, then the sums).

    Args:
        q_rows: ``[B, H, L, D]`` the query rows (e.g. ``q[:, :, S - 64:]``), ``1 <= L <= 128``.
        k: ``[B, H_KV, S, D]``, same dtype and device; GQA by grouping (``H % H_KV == 0``).
        row_start: position of the first row, ``0 <= row_start`` and ``row_start + L <= S``.
        scale: softmax scale (default ``D ** -0.5``).
        impl: ``"triton"``, ``"reference"`` or ``"auto"`` (triton on CUDA, reference elsewhere).
    """
    D = _check_rows_and_keys(q_rows, k, row_start)
    scale = check_scale(scale, D)
    if resolve_impl(impl, q_rows.device, "line_scores") == "reference":
        return line_scores_reference(q_rows, k, row_start, scale=scale)
    check_triton_head_dim(D, "line_scores")
    from .triton import line_scores_triton

    return line_scores_triton(q_rows, k, row_start, scale=scale)


def column_mass(
    q_rows: torch.Tensor, k: torch.Tensor, *, scale: float | None = None, impl: str = "auto"
) -> torch.Tensor:
    """Column mass of the attention of query rows that follow every key (no causal mask).

    Returns float32 ``[B, H, S]``: ``col[j] = sum_l softmax_j(q_l . k_j * scale)``, the
    softmax over all ``S`` keys of the row's KV head. A sequence-parallel host scores a block's
    keys for the query block this way (Spava's essential keys). The Triton path streams the keys
    twice per 128 rows (row log-sum-exp, then the sums), never holding ``[B, H, L, S]``.

    Args:
        q_rows: ``[B, H, L, D]``, ``L >= 1``; k: ``[B, H_KV, S, D]``, same dtype and device; GQA
            by grouping (``H % H_KV == 0``).
        scale: softmax scale (default ``D ** -0.5``).
        impl: ``"triton"``, ``"reference"`` or ``"auto"`` (triton on CUDA, reference elsewhere).
    """
    D = _check_qk(q_rows, k)
    scale = check_scale(scale, D)
    if resolve_impl(impl, q_rows.device, "column_mass") == "reference":
        return column_mass_reference(q_rows, k, scale=scale)
    check_triton_head_dim(D, "column_mass")
    from .columns_triton import column_mass_triton

    return column_mass_triton(q_rows, k, scale=scale)


def line_fold_search(
    q_rows: torch.Tensor,
    k: torch.Tensor,
    row_start: int,
    *,
    period: int,
    lo: int,
    hi: int,
    strides: list[int] | tuple[int, ...],
    rel_tol: float = 0.15,
    scale: float | None = None,
    impl: str = "auto",
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A Grid head's stride and phase from the last query rows (MMInference Algorithm 1 on
    :func:`line_folds`): ``(stride int64, phase int64, score float32)``, each ``[B, H]``.

    Per candidate stride ``s`` (each dividing ``period``), class ``c`` of the folded column and
    diagonal mass sums the residues ``c, c + s, ...``; the stride's score is the larger
    concentration ratio (best class / mean class) of the two kinds of line, its phase the best
    column class; the answer is the smallest stride scoring within ``rel_tol`` of the best
    (:func:`~sparse_kernels.estimate.search.search_folds_reference`).

    The Triton path is :func:`line_folds`' pass over the keys and its merge, then one program
    per head for the fold and the search: three launches, no host read.

    Args:
        q_rows, k, row_start, period, lo, hi, scale: as in :func:`line_folds`.
        strides: the candidate strides, each ``>= 1`` and dividing ``period``.
        rel_tol: ``0 <= rel_tol < 1``.
        impl: ``"triton"``, ``"reference"`` or ``"auto"`` (triton on CUDA, reference elsewhere).
    """
    D = _check_rows_and_keys(q_rows, k, row_start)
    S = k.shape[2]
    _check_fold_args(period, lo, hi, S)
    strides = tuple(sorted(strides))
    bad = [s for s in strides if isinstance(s, bool) or not isinstance(s, int) or s < 1]
    bad += [s for s in strides if s not in bad and period % s]
    if not strides or bad:
        raise ValueError(
            f"strides: expected a non-empty list of ints dividing period={period}, got "
            f"{list(strides)}"
        )
    if (
        isinstance(rel_tol, bool)
        or not isinstance(rel_tol, (int, float))
        or not (0.0 <= rel_tol < 1.0)
    ):
        raise ValueError(f"rel_tol: expected a float in [0, 1), got {rel_tol!r}")
    scale = check_scale(scale, D)
    if resolve_impl(impl, q_rows.device, "line_fold_search") == "reference":
        col, sl = line_folds_reference(
            q_rows, k, row_start, period=period, lo=lo, hi=hi, scale=scale
        )
        return search_folds_reference(col, sl, strides, rel_tol=rel_tol)
    check_triton_head_dim(D, "line_fold_search")
    from ..grid_index.search_triton import line_fold_search_triton

    return line_fold_search_triton(
        q_rows, k, row_start, period=period, lo=lo, hi=hi,
        strides=stride_vector(strides, q_rows.device), rel_tol=rel_tol, scale=scale,
    )  # fmt: skip


def _check_fold_args(period: int, lo: int, hi: int, S: int) -> None:
    for name, val in (("period", period), ("lo", lo), ("hi", hi)):
        if isinstance(val, bool) or not isinstance(val, int):
            raise TypeError(f"{name}: expected an int, got {type(val).__name__}")
    # a period past S only adds empty classes: [B, H, period] outputs of zeros
    if not 1 <= period <= S:
        raise ValueError(f"period: expected >= 1 and at most S={S}, got {period}")
    if not 0 <= lo <= hi <= S:
        raise ValueError(f"lo, hi: expected 0 <= lo <= hi <= S={S}, got lo={lo}, hi={hi}")


def _check_rows_and_keys(q_rows: torch.Tensor, k: torch.Tensor, row_start: int) -> int:
    """Validate the inputs :func:`line_scores` and :func:`line_folds` share; returns ``D``."""
    D = _check_qk(q_rows, k)
    L, S = q_rows.shape[2], k.shape[2]
    if not 1 <= L <= 128:
        raise ValueError(f"q_rows: expected 1 <= L <= 128 rows, got L={L}")
    if isinstance(row_start, bool) or not isinstance(row_start, int):
        raise TypeError(f"row_start: expected an int, got {type(row_start).__name__}")
    if row_start < 0 or row_start + L > S:
        raise ValueError(
            f"row_start: expected 0 <= row_start and row_start + L <= S (L={L}, S={S}), "
            f"got {row_start}"
        )
    return D


def _check_qk(q_rows: torch.Tensor, k: torch.Tensor) -> int:
    """Validate query rows and keys (shapes, dtypes, device, GQA); returns ``D``."""
    check_tensor(q_rows, "q_rows")
    check_tensor(k, "k")
    for name, t in (("q_rows", q_rows), ("k", k)):
        if t.ndim != 4:
            raise ValueError(
                f"{name}: expected a 4-D tensor [B, H, L|S, D], got shape {tuple(t.shape)}"
            )
        if t.dtype not in SUPPORTED_DTYPES:
            raise TypeError(f"{name}: expected dtype float16, bfloat16 or float32, got {t.dtype}")
    if q_rows.dtype != k.dtype or q_rows.device != k.device:
        raise TypeError(
            f"q_rows and k must share dtype and device, got {q_rows.dtype}/{q_rows.device} "
            f"and {k.dtype}/{k.device}"
        )
    B, H, L, D = q_rows.shape
    Bk, H_KV, S, Dk = k.shape
    if Bk != B or Dk != D:
        raise ValueError(
            f"k: expected [B={B}, H_KV, S, D={D}] to match q_rows, got {tuple(k.shape)}"
        )
    if H_KV == 0 or H % H_KV:
        raise ValueError(f"GQA needs H % H_KV == 0, got H={H}, H_KV={H_KV}")
    if B == 0 or D == 0:
        raise ValueError(
            f"q_rows: expected B >= 1 and a head dim D >= 1, got shape {tuple(q_rows.shape)}"
        )
    if L == 0 or S == 0:
        raise ValueError(
            f"expected at least one query row and one key, got L={L} rows and S={S} keys"
        )
    return D


def line_folds(
    q_rows: torch.Tensor,
    k: torch.Tensor,
    row_start: int,
    *,
    period: int,
    lo: int,
    hi: int,
    scale: float | None = None,
    impl: str = "auto",
) -> tuple[torch.Tensor, torch.Tensor]:
    """The line scores of :func:`line_scores` over the positions ``lo .. hi - 1``, summed per
    residue modulo ``period``: float32 ``(vertical_fold, slash_fold)``, each ``[B, H, period]``,
    ``vertical_fold[c] = sum of vertical[j] over lo <= j < hi, j % period == c`` and the same of
    ``slash`` over the diagonal offsets ``o``. The rows' distributions are over all their
    causally visible keys (the window only selects what is summed).

    This is all a Grid head's stride and phase search reads when every candidate stride divides
    ``period``. The Triton path streams the keys once (online softmax, one accumulator of
    ``L x period`` partial sums per row and program, no log-sum-exp pass, no ``[B, H, S]``
    vectors): about half the work of :func:`line_scores`, whose second pass also gathers every
    tile along its diagonals.

    Args:
        q_rows, k, row_start, scale: as in :func:`line_scores`.
        period: ``>= 1``.
        lo, hi: ``0 <= lo <= hi <= S``.
        impl: ``"triton"``, ``"reference"`` or ``"auto"`` (triton on CUDA, reference elsewhere).
    """
    D = _check_rows_and_keys(q_rows, k, row_start)
    _check_fold_args(period, lo, hi, k.shape[2])
    scale = check_scale(scale, D)
    if resolve_impl(impl, q_rows.device, "line_folds") == "reference":
        return line_folds_reference(q_rows, k, row_start, period=period, lo=lo, hi=hi, scale=scale)
    check_triton_head_dim(D, "line_folds")
    from ..grid_index.fold_launch import line_folds_triton

    return line_folds_triton(q_rows, k, row_start, period=period, lo=lo, hi=hi, scale=scale)
