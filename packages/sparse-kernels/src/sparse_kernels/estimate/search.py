"""Algorithm 1's stride and phase choice on folded line scores, in PyTorch: the reference of the
Triton search that :func:`~sparse_kernels.estimate.line_fold_search` fuses after the fold kernel
(``sparse_patterns.estimate`` searches with it too)."""

from __future__ import annotations

import functools

import torch


def search_folds_reference(
    col_fold: torch.Tensor,
    sl_fold: torch.Tensor,
    strides: list[int] | tuple[int, ...],
    *,
    rel_tol: float = 0.15,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The smallest stride whose score is within ``rel_tol`` of the best, with its phase.

    ``col_fold``, ``sl_fold``: ``[..., P]`` column and diagonal mass summed per residue modulo
    ``P`` (every residue over the same number of positions); every stride divides ``P``.
    Stride ``s``'s class ``c`` sums the residues ``c, c + s, ...``; its score is the larger of
    the two concentration ratios (best class / mean class); its phase is the best class of the
    column sums. Returns ``(stride int64, phase int64, score float32)``, each ``[...]``."""
    fold, valid, svec = residue_fold(tuple(sorted(strides)), col_fold.shape[-1], col_fold.device)
    v = torch.stack([col_fold, sl_fold]).float() @ fold  # [2, ..., sum(s)]
    sc, ph = ratios_of_class_sums(v, valid, svec)
    return smallest_near_best(sc, ph, svec, rel_tol)


def smallest_near_best(
    sc: torch.Tensor, ph: torch.Tensor, svec: torch.Tensor, rel_tol: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The smallest stride whose score ``sc [N, k]`` is within ``rel_tol`` of the best, with
    its phase (``ph [N, k]``) and score (``svec [k]``: the strides, ascending)."""
    best = sc.amax(-1, keepdim=True)
    first = (sc >= best * (1.0 - rel_tol)).to(torch.int8).argmax(-1, keepdim=True)
    st = svec[first.squeeze(-1)]
    return st, ph.gather(-1, first).squeeze(-1), sc.gather(-1, first).squeeze(-1)


def ratios_of_class_sums(
    v: torch.Tensor, valid: torch.Tensor, svec: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-stride concentration ratios of class sums ``v [2, N, sum(s)]`` (stride-major, both
    kinds of line), on a padded ``[k, P]`` view: ``(score [N, k], phase of the column view
    [N, k])``."""
    vp = v[..., valid.clamp_min(0)].masked_fill(valid < 0, float("-inf"))  # [2, N, k, P]
    best, arg = vp.max(-1)
    mean = vp.masked_fill(valid < 0, 0.0).sum(-1) / svec
    return (best / mean.clamp_min(1e-30)).amax(0), arg[0]


@functools.lru_cache(maxsize=64)
def residue_fold(strides: tuple[int, ...], P: int, device: torch.device):
    """``fold [P, sum(s)]`` (residue mod ``P`` -> class of each stride, stride-major),
    ``valid [k, P]`` (column of (stride i, class c), -1 past the stride), ``svec [k]`` (int64),
    made once per (strides, P, device)."""
    fold = torch.zeros(P, sum(strides))
    valid = torch.full((len(strides), P), -1, dtype=torch.long)
    r = torch.arange(P)
    o = 0
    for i, s in enumerate(strides):
        fold[r, o + r % s] = 1.0
        valid[i, :s] = torch.arange(o, o + s)
        o += s
    return tuple(host_to_device(t, device) for t in (fold, valid, torch.tensor(strides)))


def host_to_device(t: torch.Tensor, device: torch.device | str) -> torch.Tensor:
    """Host tensor ``t`` on ``device`` without making the host wait: to CUDA through pinned
    memory (a plain ``.to("cuda")`` of pageable memory waits for the queued kernels)."""
    device = torch.device(device)
    if device.type != "cuda":
        return t.to(device)
    return t.pin_memory().to(device, non_blocking=True)


@functools.lru_cache(maxsize=64)
def stride_vector(strides: tuple[int, ...], device: torch.device) -> torch.Tensor:
    """The candidate strides as the search kernel takes them: int32 ``[k]`` on ``device``,
    ascending, made once per value."""
    return host_to_device(torch.tensor(sorted(strides), dtype=torch.int32), device)
