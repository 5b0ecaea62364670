"""What every group planner of a layer shares: the head configs, per-head parameters as device
tensors, and :class:`LayerContext`, the layer's estimation inputs made once for all groups."""

from __future__ import annotations

import functools
from collections.abc import Sequence

import torch

from .. import estimate as E
from .._device import heads_index, to_device
from ..patterns import HeadConfig


def normalize_head_configs(head_config, H: int) -> list[HeadConfig]:
    """A single HeadConfig / pattern (all heads) or a sequence of H of them -> list of H."""
    if isinstance(head_config, HeadConfig):
        return [head_config] * H
    if not isinstance(head_config, Sequence) or isinstance(head_config, (str, bytes)):
        try:
            return [HeadConfig(head_config)] * H
        except TypeError:
            raise TypeError(
                f"head_config: expected a HeadConfig, a pattern spec or a sequence of {H} "
                f"HeadConfig, got {type(head_config).__name__}"
            ) from None
    if len(head_config) != H:
        raise ValueError(
            f"head_config: expected {H} entries (one per query head), got {len(head_config)}"
        )
    c0 = head_config[0] if H else None
    if isinstance(c0, HeadConfig) and all(c is c0 for c in head_config):
        return list(head_config)  # one config for every head (checked once)
    out = []
    for h, c in enumerate(head_config):
        if not isinstance(c, HeadConfig):
            raise TypeError(f"head_config[{h}]: expected a HeadConfig, got {type(c).__name__}")
        out.append(c)
    return out


def per_head(
    cfgs: list, B: int, field: str, dev, base: str = "pattern", dtype=torch.int64
) -> torch.Tensor:
    """``cfgs[h].<base>.<field>`` as a ``[B * Hg]`` tensor on ``dev`` (b-major)."""
    vals = [getattr(getattr(c, base), field) for c in cfgs]
    return to_device(torch.tensor(vals, dtype=dtype), dev).repeat(B)


def topk_per_head(
    scores: torch.Tensor,
    k: torch.Tensor,
    forced: torch.Tensor,
    k_max: int,
    *,
    drop_masked: bool = True,
) -> torch.Tensor:
    """``scores [N, ..., S]``, ``k``/``forced`` ``[N]``: top ``k[n]`` indices with the first
    ``forced[n]`` positions always in; int64 ``[N, ..., kmax]`` with -1 past ``k[n]``.
    ``k_max``: ``max(k)``, from the host configs (reading it from ``k`` would synchronise).
    ``drop_masked``: a selected score of -inf (a masked position) or NaN gives -1 too, so the
    number of real indices depends on the data; with False every row holds exactly
    ``min(k[n], S)`` real indices, a count known on the host."""
    S = scores.shape[-1]
    shape = (-1,) + (1,) * (scores.ndim - 1)
    s = scores.masked_fill(
        torch.arange(S, device=scores.device) < forced.reshape(shape), float("inf")
    )
    kmax = min(S, k_max)
    if kmax == 0:
        return torch.full((*scores.shape[:-1], 1), -1, dtype=torch.int64, device=scores.device)
    vals, idx = torch.topk(s, kmax, dim=-1, sorted=True)
    keep = torch.arange(kmax, device=s.device) < k.reshape(shape)
    if drop_masked:
        keep = keep & (vals > float("-inf"))
    return torch.where(keep, idx, -1)


def _modality_rows(mod: torch.Tensor, uniq: torch.Tensor, L: int) -> torch.Tensor:
    """``[M, L]``: the last ``L`` positions of each modality (repeating its first position when
    it has fewer tokens)."""
    rows = []
    for m in uniq.tolist():
        pos = torch.nonzero(mod == m).flatten()[-L:]
        if pos.numel() < L:
            pos = torch.cat([pos[:1].expand(L - pos.numel()), pos])
        rows.append(pos)
    return torch.stack(rows)


class LayerContext:
    """Per-layer shared tensors, computed lazily once for all heads that need them.

    ``impl``: the engine of the estimation steps that have several (``"triton"``,
    ``"reference"``, ``"auto"``: as :func:`~sparse_patterns.estimate.last_line_scores` picks)."""

    def __init__(self, q, k, layout, block: int, scale: float, *, impl: str = "auto"):
        self.q, self.k, self.block, self.scale, self.impl = q, k, block, scale, impl
        self.B, self.H, self.S, _ = q.shape
        self.layout = layout
        self._p_mod: dict[int, torch.Tensor] = {}
        self._lines_last: dict[int, tuple] = {}
        self._line_folds: dict[tuple[int, int], tuple] = {}
        self.mod = layout.modality

    # Modality bookkeeping only the boundary planners need (torch.unique syncs with the GPU).
    @functools.cached_property
    def uniq(self) -> torch.Tensor:
        return torch.unique(self.mod)

    @property
    def mperm(self) -> torch.Tensor:
        """int64 ``[S]``: the layout's permutation to modality order (a stable sort by id)."""
        return self.layout.perm

    @property
    def inv_mperm(self) -> torch.Tensor:
        """int64 ``[S]``: the modality-order position of each token (:attr:`mperm`'s inverse)."""
        return self.layout.inv_perm

    @functools.cached_property
    def mod_index(self) -> torch.Tensor:
        return torch.searchsorted(self.uniq, self.mod)  # [S] in 0..M-1

    def has_lines_last(self, L: int) -> bool:
        """Whether another group of the layer already made the line scores of ``L`` queries."""
        return L in self._lines_last

    def lines_last(self, L: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Column and diagonal mass of the last ``L`` queries, ``[B, H, S]`` each (the Triton
        line-score kernel on CUDA: no ``[H, L, S]`` matrix)."""
        if L not in self._lines_last:
            self._lines_last[L] = E.last_line_scores(
                self.q, self.k, L, scale=self.scale, impl=self.impl
            )
        return self._lines_last[L]

    def line_folds(self, L: int, period: int) -> tuple[torch.Tensor, torch.Tensor]:
        """:func:`~sparse_patterns.estimate.last_line_folds` of the last ``L`` queries,
        ``[B, H, period]`` each: folded from the line scores when another group of the layer
        already made them, else one pass of the fold kernel (on CUDA)."""
        key = (L, period)
        if key not in self._line_folds:
            if L in self._lines_last:
                self._line_folds[key] = E.fold_grid_lines(*self._lines_last[L], period)
            else:
                self._line_folds[key] = E.last_line_folds(
                    self.q, self.k, L, period=period, scale=self.scale, impl=self.impl
                )
        return self._line_folds[key]

    def p_mod(self, L: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Approximate scores of the last ``L`` queries of each modality, ``[B, H, M, L, S]``,
        and those rows ``[M, L]``."""
        rows = _modality_rows(self.mod, self.uniq, L)
        if L not in self._p_mod:
            self._p_mod[L] = E.approx_scores(self.q, self.k, rows, scale=self.scale)
        return self._p_mod[L], rows

    def sel(self, t: torch.Tensor, hs: list[int]) -> torch.Tensor:
        """``[B, H, ...] -> [B * len(hs), ...]`` (b-major; no copy when ``hs`` is every head)."""
        if list(hs) == list(range(t.shape[1])):
            return t.reshape(-1, *t.shape[2:])
        return t[:, heads_index(list(hs), t.device)].reshape(-1, *t.shape[2:])
