"""The token layout the patterns need: per-token modality, tokens per frame (the Grid stride
prior), and the permutation to modality order with its exact inverse.

:class:`TokenLayoutLike` is that contract, as a Protocol: ``modality_index.ModalityLayout``
satisfies it as it is (sparse-patterns does not import modality-index), and so does
:class:`TokenLayout`, the minimal explicit form. :func:`as_token_layout` accepts exactly None,
a TokenLayout or a TokenLayoutLike, and keeps the layout's own permutation.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Protocol

import torch


class TokenLayoutLike(Protocol):
    """What the planner reads of a layout (``modality_index.ModalityLayout`` has all four)."""

    @property
    def modality(self) -> torch.Tensor:
        """int ``[S]``: each token's modality id (0 text, 1 image, 2 video)."""
        ...

    @property
    def tokens_per_frame(self) -> int | None:
        """Tokens of one visual frame (the Grid stride prior); None without a visual grid."""
        ...

    @property
    def perm(self) -> torch.Tensor:
        """int64 ``[S]``: ``x[perm]`` puts the tokens in modality order, token order kept
        inside each modality (a stable sort by modality)."""
        ...

    @property
    def inv_perm(self) -> torch.Tensor:
        """int64 ``[S]``: the exact inverse, ``x[perm][inv_perm] == x``."""
        ...


LAYOUT_ATTRIBUTES = ("modality", "tokens_per_frame", "perm", "inv_perm")


def modality_order(modality: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(perm, inv_perm)`` of a per-token modality tensor: the stable sort by modality
    (``modality_index.ModalityLayout`` computes the same) and its exact inverse."""
    perm = torch.sort(modality, stable=True).indices
    inv = torch.empty_like(perm)
    inv[perm] = torch.arange(perm.numel(), device=perm.device)
    return perm, inv


@dataclass(frozen=True)
class TokenLayout:
    """``modality``: int ``[S]`` (any small non-negative ids, e.g. 0 text, 1 image, 2 video);
    ``tokens_per_frame``: the Grid stride prior (None when there is no visual grid).

    ``perm`` / ``inv_perm`` (:class:`TokenLayoutLike`) are computed on first use, on the
    modality's device; a layout made by :func:`as_token_layout` from another layout carries that
    layout's own permutation instead."""

    modality: torch.Tensor
    tokens_per_frame: int | None = None

    def __post_init__(self) -> None:
        m = self.modality
        if not isinstance(m, torch.Tensor):
            raise TypeError(
                f"TokenLayout.modality: expected a torch.Tensor, got {type(m).__name__}"
            )
        if m.ndim != 1 or m.dtype.is_floating_point or m.dtype == torch.bool:
            raise ValueError(
                f"TokenLayout.modality: expected a 1-D integer tensor [S], got "
                f"{m.dtype} of shape {tuple(m.shape)}"
            )
        if m.numel() and int(m.min()) < 0:
            raise ValueError(f"TokenLayout.modality: expected ids >= 0, got min {int(m.min())}")
        tpf = self.tokens_per_frame
        if tpf is not None and (isinstance(tpf, bool) or not isinstance(tpf, int) or tpf < 1):
            raise ValueError(
                f"TokenLayout.tokens_per_frame: expected an int >= 1 or None, got {tpf!r}"
            )

    @functools.cached_property
    def _order(self) -> tuple[torch.Tensor, torch.Tensor]:
        given = self.__dict__.get("_given_order")
        if given is None:
            return modality_order(self.modality)
        dev = self.modality.device
        return given[0].to(dev), given[1].to(dev)

    @property
    def perm(self) -> torch.Tensor:
        """int64 ``[S]``: ``x[perm]`` puts the tokens in modality order (a stable sort)."""
        return self._order[0]

    @property
    def inv_perm(self) -> torch.Tensor:
        """int64 ``[S]``: the exact inverse of :attr:`perm`."""
        return self._order[1]

    @classmethod
    def text(cls, S: int, device: torch.device | str | None = None) -> TokenLayout:
        return cls._trusted(torch.zeros(S, dtype=torch.int64, device=device), None)

    def segment(self, start: int, stop: int) -> TokenLayout:
        """The layout of tokens ``[start, stop)`` (e.g. one sequence-parallel host's rows): the
        modality slice, the same ``tokens_per_frame``, the permutation recomputed on first use.
        A slice of a checked layout is valid, so it is not checked again (that check reads the
        modality back from the device)."""
        S = self.modality.shape[0]
        for name, value in (("start", start), ("stop", stop)):
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"TokenLayout.segment: {name}: expected an int, got {value!r}")
        if not 0 <= start <= stop <= S:
            raise ValueError(
                f"TokenLayout.segment: expected 0 <= start <= stop <= {S} (the layout's tokens), "
                f"got start={start}, stop={stop}"
            )
        return TokenLayout._trusted(self.modality[start:stop], self.tokens_per_frame)

    @classmethod
    def _trusted(
        cls,
        modality: torch.Tensor,
        tokens_per_frame: int | None,
        order: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> TokenLayout:
        """A layout whose fields are known to be valid, built without the checks (the
        ``min >= 0`` check reads the modality back from the device: a synchronisation on CUDA).
        ``order``: the ``(perm, inv_perm)`` it carries, on any device."""
        out = object.__new__(cls)
        object.__setattr__(out, "modality", modality)
        object.__setattr__(out, "tokens_per_frame", tokens_per_frame)
        if order is not None:
            out.__dict__["_given_order"] = order
        return out

    @classmethod
    def from_spans(
        cls,
        spans: list[tuple[int, int]],
        *,
        tokens_per_frame: int | None = None,
        device: torch.device | str | None = None,
    ) -> TokenLayout:
        """``spans``: consecutive ``(modality_id, length)`` runs in token order."""
        ids = [torch.full((n,), m, dtype=torch.int64) for m, n in spans]
        return cls(torch.cat(ids).to(device), tokens_per_frame)


def _given_order(layout, S: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``(perm, inv_perm)`` of a TokenLayoutLike, checked for type, dtype and shape."""
    out = []
    for name in ("perm", "inv_perm"):
        t = getattr(layout, name)
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"layout.{name}: expected a torch.Tensor, got {type(t).__name__}")
        if t.dtype != torch.int64 or tuple(t.shape) != (S,):
            raise ValueError(
                f"layout.{name}: expected int64 of shape ({S},) (one index per token), got "
                f"{t.dtype} of shape {tuple(t.shape)}"
            )
        out.append(t)
    return out[0], out[1]


def as_token_layout(
    layout: TokenLayout | TokenLayoutLike | None, S: int, device: torch.device
) -> TokenLayout:
    """``layout`` as a :class:`TokenLayout` of ``S`` tokens on ``device``: None is all text; a
    TokenLayout is kept; any other :class:`TokenLayoutLike` (e.g.
    ``modality_index.ModalityLayout``) is read through its four attributes, its own permutation
    kept. Raises TypeError naming the attributes an object lacks, ValueError for a wrong length."""
    if layout is None:
        return TokenLayout.text(S, device)
    if isinstance(layout, TokenLayout):
        tl = layout
        order = tl.__dict__.get("_given_order")
    else:
        missing = [a for a in LAYOUT_ATTRIBUTES if not hasattr(layout, a)]
        if missing:
            raise TypeError(
                f"layout: expected None, a TokenLayout or a TokenLayoutLike (attributes "
                f"{', '.join(LAYOUT_ATTRIBUTES)}; e.g. modality_index.ModalityLayout), got "
                f"{type(layout).__name__} without {', '.join(missing)}"
            )
        tl = TokenLayout(layout.modality, layout.tokens_per_frame)
        order = _given_order(layout, tl.modality.shape[0])
    if tl.modality.shape[0] != S:
        raise ValueError(
            f"layout: expected {S} tokens (the sequence length), got {tl.modality.shape[0]}"
        )
    m = tl.modality
    if m.device == device and m.dtype == torch.int64 and tl is layout:
        return tl
    # Checked when ``tl`` was built; only moved here.
    return TokenLayout._trusted(m.to(device=device, dtype=torch.int64), tl.tokens_per_frame, order)
