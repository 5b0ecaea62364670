"""The token layout the patterns need: per-token modality and tokens per frame.

``modality_index.ModalityLayout`` (helper package) is accepted duck-typed: any object with a
per-token integer modality tensor (attribute ``modality``, ``modalities`` or ``token_modality``)
and optionally ``tokens_per_frame`` works. :class:`TokenLayout` is the minimal explicit form.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

_MODALITY_ATTRS = ("modality", "modalities", "token_modality")


@dataclass(frozen=True)
class TokenLayout:
    """``modality``: int ``[S]`` (any small non-negative ids, e.g. 0 text, 1 image, 2 video);
    ``tokens_per_frame``: the Grid stride prior (None when there is no visual grid)."""

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

    @classmethod
    def text(cls, S: int, device: torch.device | str | None = None) -> TokenLayout:
        return cls._trusted(torch.zeros(S, dtype=torch.int64, device=device), None)

    @classmethod
    def _trusted(cls, modality: torch.Tensor, tokens_per_frame: int | None) -> TokenLayout:
        """A layout whose fields are known to be valid, built without the checks (the
        ``min >= 0`` check reads the modality back from the device: a synchronisation on CUDA)."""
        out = object.__new__(cls)
        object.__setattr__(out, "modality", modality)
        object.__setattr__(out, "tokens_per_frame", tokens_per_frame)
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


def as_token_layout(layout: object, S: int, device: torch.device) -> TokenLayout:
    """Normalise ``None`` (all text), a :class:`TokenLayout` or a ModalityLayout-like object."""
    if layout is None:
        return TokenLayout.text(S, device)
    if isinstance(layout, TokenLayout):
        tl = layout
    else:
        mod = next((getattr(layout, a) for a in _MODALITY_ATTRS if hasattr(layout, a)), None)
        if mod is None:
            raise TypeError(
                f"layout: expected None, a TokenLayout or an object with a per-token modality "
                f"tensor (one of {_MODALITY_ATTRS}), got {type(layout).__name__}"
            )
        if not isinstance(mod, torch.Tensor):
            mod = torch.as_tensor([int(x) for x in mod])
        tpf = getattr(layout, "tokens_per_frame", None)
        if isinstance(tpf, torch.Tensor):
            tpf = int(tpf.reshape(-1)[0]) if tpf.numel() else None
        elif isinstance(tpf, (list, tuple)):
            tpf = int(tpf[0]) if tpf else None
        tl = TokenLayout(mod.long(), tpf)
    if tl.modality.shape[0] != S:
        raise ValueError(
            f"layout: expected {S} tokens (the sequence length), got {tl.modality.shape[0]}"
        )
    m = tl.modality
    if m.device == device and m.dtype == torch.int64:
        return tl
    # Checked when ``tl`` was built; only moved here.
    return TokenLayout._trusted(m.to(device=device, dtype=torch.int64), tl.tokens_per_frame)
