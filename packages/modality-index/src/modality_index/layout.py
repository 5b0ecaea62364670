"""Which token is text, image or video frame, and the permutation to modality order."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import IntEnum

import torch


class Modality(IntEnum):
    TEXT = 0
    IMAGE = 1
    VIDEO = 2


@dataclass(frozen=True)
class VisualItem:
    """One image or video in the sequence: its token span and frame structure.

    ``start``/``length``: the span of its tokens; ``tokens_per_frame``: tokens of one frame (an
    image is one frame; for Qwen2-VL a "frame" is one temporal patch group); ``num_frames``;
    ``grid_thw``: the processor's grid (before the spatial merge) when known.
    """

    modality: Modality
    start: int
    length: int
    tokens_per_frame: int
    num_frames: int
    grid_thw: tuple[int, int, int] | None = None


@dataclass(frozen=True)
class ModalityLayout:
    """Per-token modality of one sequence and everything derived from it.

    Attributes:
        modality: int64 ``[S]``, values of :class:`Modality`.
        items: the images and videos in token order.
        seg_cu_seqlens: int32 ``[n_seg + 1]``: boundaries of maximal runs of one modality.
        seg_modality: int64 ``[n_seg]``: the modality of each run.
        frame_spans: int32 ``[n_frames, 2]``: ``(start, end)`` of every visual frame, in token
            order (text tokens, and a trailing newline token of a LLaVA video, are in no frame).
        perm: int64 ``[S]``: ``x[perm]`` puts the tokens in modality order (text, image, video),
            keeping token order inside each modality (a stable sort).
        inv_perm: int64 ``[S]``: the exact inverse, ``x[perm][inv_perm] == x``.
        modality_cu_seqlens: int32 ``[4]``: offsets of text, image and video in permuted order.
    """

    modality: torch.Tensor
    items: tuple[VisualItem, ...] = ()
    seg_cu_seqlens: torch.Tensor = field(default=None, repr=False)  # type: ignore[assignment]
    seg_modality: torch.Tensor = field(default=None, repr=False)  # type: ignore[assignment]
    frame_spans: torch.Tensor = field(default=None, repr=False)  # type: ignore[assignment]
    perm: torch.Tensor = field(default=None, repr=False)  # type: ignore[assignment]
    inv_perm: torch.Tensor = field(default=None, repr=False)  # type: ignore[assignment]
    modality_cu_seqlens: torch.Tensor = field(default=None, repr=False)  # type: ignore[assignment]

    def __post_init__(self) -> None:
        m = self.modality
        if not isinstance(m, torch.Tensor) or m.ndim != 1 or m.dtype.is_floating_point:
            got = f"{m.dtype} {tuple(m.shape)}" if isinstance(m, torch.Tensor) else type(m).__name__
            raise ValueError(f"modality: expected a 1-D integer tensor [S], got {got}")
        if m.numel() == 0:
            raise ValueError("modality: expected at least one token, got an empty sequence")
        if int(m.min()) < 0 or int(m.max()) > 2:
            raise ValueError(
                f"modality: expected values in 0..2 (text, image, video), got {int(m.min())}..{int(m.max())}"
            )
        m = m.to(torch.int64)
        S = m.numel()
        for it in self.items:
            end = it.start + it.length
            if it.start < 0 or end > S or it.length < 1:
                raise ValueError(f"{it}: span [{it.start}, {end}) outside the sequence [0, {S})")
            if bool((m[it.start : end] != int(it.modality)).any()):
                raise ValueError(f"{it}: its tokens are not all {it.modality.name}")
        change = torch.nonzero(m[1:] != m[:-1]).flatten() + 1
        seg = torch.cat(
            [
                torch.zeros(1, dtype=torch.int64, device=m.device),
                change,
                torch.tensor([S], device=m.device),
            ]
        )
        bounds: list[int] = []
        for it in self.items:
            for f in range(it.num_frames):
                s = it.start + f * it.tokens_per_frame
                bounds += [s, min(s + it.tokens_per_frame, it.start + it.length)]
        frame_spans = torch.tensor(bounds, dtype=torch.int32, device=m.device).view(-1, 2)
        perm = torch.sort(m, stable=True).indices
        inv = torch.empty_like(perm)
        inv[perm] = torch.arange(S, device=m.device)
        counts = torch.bincount(m, minlength=3)
        mcu = torch.zeros(4, dtype=torch.int32, device=m.device)
        mcu[1:] = torch.cumsum(counts, 0).to(torch.int32)
        set_ = object.__setattr__
        set_(self, "modality", m)
        set_(self, "seg_cu_seqlens", seg.to(torch.int32))
        set_(self, "seg_modality", m[seg[:-1]])
        set_(self, "frame_spans", frame_spans)
        set_(self, "perm", perm)
        set_(self, "inv_perm", inv)
        set_(self, "modality_cu_seqlens", mcu)

    # ---- derived facts -------------------------------------------------------------------
    @property
    def seq_len(self) -> int:
        return int(self.modality.numel())

    @property
    def tokens_per_frame(self) -> int | None:
        """The Grid stride prior: tokens per frame of the first video (else the first image)."""
        for kind in (Modality.VIDEO, Modality.IMAGE):
            for it in self.items:
                if it.modality == kind:
                    return it.tokens_per_frame
        return None

    @property
    def num_frames(self) -> int:
        return sum(it.num_frames for it in self.items)

    @property
    def is_mixed(self) -> bool:
        """True when there is more than one visual run (visual tokens interleaved with text or
        with another visual modality): the case where Q-/2D-Boundary heads matter. A single video
        between a text prefix and a text question is not mixed."""
        return int((self.seg_modality != int(Modality.TEXT)).sum()) > 1

    def counts(self) -> dict[Modality, int]:
        c = torch.bincount(self.modality, minlength=3).tolist()
        return {Modality(i): int(n) for i, n in enumerate(c)}

    # ---- permutation ---------------------------------------------------------------------
    def permute(self, x: torch.Tensor, dim: int = -2) -> torch.Tensor:
        """Tokens of ``x`` along ``dim`` in modality order (a gather; copies)."""
        self._check_dim(x, dim)
        return x.index_select(dim, self.perm.to(x.device))

    def unpermute(self, x: torch.Tensor, dim: int = -2) -> torch.Tensor:
        """Exact inverse of :meth:`permute`."""
        self._check_dim(x, dim)
        return x.index_select(dim, self.inv_perm.to(x.device))

    def _check_dim(self, x: torch.Tensor, dim: int) -> None:
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"x: expected a torch.Tensor, got {type(x).__name__}")
        if not -x.ndim <= dim < x.ndim:
            raise ValueError(
                f"dim: expected a dim of x in [{-x.ndim}, {x.ndim}), got {dim} "
                f"(x shape {tuple(x.shape)})"
            )
        if x.shape[dim] != self.seq_len:
            raise ValueError(
                f"expected {self.seq_len} tokens along dim {dim}, got shape {tuple(x.shape)}"
            )

    # ---- constructors --------------------------------------------------------------------
    @classmethod
    def from_spans(
        cls,
        spans: Sequence[tuple[Modality | int, int] | tuple[Modality | int, int, int | None]],
        *,
        device: torch.device | str | None = None,
    ) -> ModalityLayout:
        """Explicit spans in token order: ``(modality, length)`` or ``(modality, length,
        tokens_per_frame)``. A visual span is one item; its length must be a multiple of
        ``tokens_per_frame`` (default: the whole span is one frame)."""
        if isinstance(spans, (str, bytes)) or not isinstance(spans, Sequence):
            raise TypeError(f"spans: expected a sequence of tuples, got {type(spans).__name__}")
        mods, items, pos = [], [], 0
        for sp in spans:
            if not isinstance(sp, (tuple, list)) or len(sp) not in (2, 3):
                raise ValueError(f"span {sp!r}: expected (modality, length[, tokens_per_frame])")
            mod = _modality(sp[0], f"span {sp!r}: modality")
            n = _strict_int(sp[1], f"span {sp!r}: length", 1)
            tpf = sp[2] if len(sp) == 3 else None
            if mod == Modality.TEXT and tpf is not None:
                raise ValueError(f"span {sp!r}: a text span takes no tokens_per_frame, got {tpf!r}")
            if mod != Modality.TEXT:
                tpf = n if tpf is None else _strict_int(tpf, f"span {sp!r}: tokens_per_frame", 1)
                if n % tpf:
                    raise ValueError(
                        f"span {sp!r}: length {n} is not a multiple of tokens_per_frame {tpf}"
                    )
                items.append(VisualItem(mod, pos, n, tpf, n // tpf))
            mods.append(torch.full((n,), int(mod), dtype=torch.int64))
            pos += n
        if not mods:
            raise ValueError("spans: expected at least one span, got none")
        try:
            device = torch.device(device) if device is not None else None
        except (RuntimeError, TypeError) as e:
            raise ValueError(f"device: expected a torch device, got {device!r}") from e
        return cls(torch.cat(mods).to(device), tuple(items))

    @classmethod
    def from_qwen2_vl(
        cls,
        input_ids: torch.Tensor,
        *,
        image_token_id: int,
        video_token_id: int,
        image_grid_thw: torch.Tensor | None = None,
        video_grid_thw: torch.Tensor | None = None,
        spatial_merge_size: int = 2,
        mm_token_type_ids: torch.Tensor | None = None,
    ) -> ModalityLayout:
        """Layout of a Qwen2-VL / Qwen2.5-VL input (one sequence).

        The processor expands every image/video into ``t * h * w / merge**2`` pad tokens
        (``image_token_id`` / ``video_token_id``) between vision start/end tokens (those two are
        text here). A video "frame" is one temporal patch group: ``h * w / merge**2`` tokens, ``t``
        of them. The pad counts must match the grids exactly; ``mm_token_type_ids``, when
        given, must agree (0 text, 1 image, 2 video).
        """
        ids = _one_sequence(input_ids, "input_ids")
        merge = _strict_int(spatial_merge_size, "spatial_merge_size", 1)
        merge2 = merge**2
        if image_token_id == video_token_id:
            raise ValueError(
                f"image_token_id and video_token_id: expected two different ids, got "
                f"{image_token_id} for both"
            )
        mod = torch.zeros_like(ids, dtype=torch.int64)
        mod[ids == image_token_id] = int(Modality.IMAGE)
        mod[ids == video_token_id] = int(Modality.VIDEO)
        items = []
        for kind, grid, name in (
            (Modality.IMAGE, image_grid_thw, "image_grid_thw"),
            (Modality.VIDEO, video_grid_thw, "video_grid_thw"),
        ):
            runs = _runs(mod, int(kind))
            grids = [] if grid is None else _grids(grid, name, merge)
            # One item may be split over several runs only if runs are adjacent; Qwen places
            # each item in its own start/end pair, so runs and grids pair up in order.
            sizes = [t * h * w // merge2 for t, h, w in grids]
            if sum(n for _, n in runs) != sum(sizes):
                raise ValueError(
                    f"{name}: the grids need {sum(sizes)} {kind.name.lower()} pad tokens, "
                    f"input_ids has {sum(n for _, n in runs)}"
                )
            runs = _split_runs(runs, sizes, name)
            for (start, n), (t, h, w) in zip(runs, grids):
                tpf = h * w // merge2
                items.append(VisualItem(kind, start, n, tpf, t, (t, h, w)))
        if mm_token_type_ids is not None:
            tt = _one_sequence(mm_token_type_ids, "mm_token_type_ids").to(torch.int64)
            if tt.shape != mod.shape or not torch.equal(tt.to(mod.device), mod):
                raise ValueError(
                    "mm_token_type_ids disagrees with the image/video pad tokens of input_ids"
                )
        items.sort(key=lambda it: it.start)
        return cls(mod, tuple(items))

    @classmethod
    def from_llava_onevision(
        cls,
        input_ids: torch.Tensor,
        *,
        image_token_id: int,
        video_token_id: int,
        video_tokens_per_frame: int,
        image_tokens: Sequence[int] | None = None,
    ) -> ModalityLayout:
        """Layout of a LLaVA-OneVision / LLaVA-Video input (one sequence).

        The processor expands each video into ``num_frames * video_tokens_per_frame`` video
        tokens (pooled per frame) followed by one newline token that also carries the video
        token id; that trailing token is kept as VIDEO but belongs to no frame. Each image is one
        item of ``image_tokens[i]`` tokens (one "frame"; its anyres tiles are not split).
        """
        ids = _one_sequence(input_ids, "input_ids")
        mod = torch.zeros_like(ids, dtype=torch.int64)
        mod[ids == image_token_id] = int(Modality.IMAGE)
        mod[ids == video_token_id] = int(Modality.VIDEO)
        items = []
        img_runs = _runs(mod, int(Modality.IMAGE))
        if image_tokens is not None:
            img_runs = _split_runs(
                img_runs,
                [_strict_int(x, "image_tokens[i]", 1) for x in image_tokens],
                "image_tokens",
            )
        for start, n in img_runs:
            items.append(VisualItem(Modality.IMAGE, start, n, n, 1))
        tpf = _strict_int(video_tokens_per_frame, "video_tokens_per_frame", 1)
        for start, n in _runs(mod, int(Modality.VIDEO)):
            if tpf < 1 or (n - 1) % tpf or n < tpf + 1:
                raise ValueError(
                    f"video run of {n} tokens at {start}: expected frames * {tpf} + 1 (newline)"
                )
            items.append(VisualItem(Modality.VIDEO, start, n, tpf, (n - 1) // tpf))
        items.sort(key=lambda it: it.start)
        return cls(mod, tuple(items))


def _strict_int(value: object, name: str, lo: int) -> int:
    """An int (or integer tensor scalar) >= ``lo``; a float or bool would be truncated or
    taken for 0/1 without a word."""
    if isinstance(value, torch.Tensor) and value.numel() == 1 and not value.is_floating_point():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name}: expected an int, got {type(value).__name__} {value!r:.40}")
    if not lo <= value < 2**62:
        raise ValueError(f"{name}: expected an int in [{lo}, 2**62), got {value}")
    return value


def _modality(value: object, name: str) -> Modality:
    allowed = {m.value: m for m in Modality}
    v = _strict_int(value, name, 0) if not isinstance(value, Modality) else value.value
    if v not in allowed:
        raise ValueError(f"{name}: expected one of {sorted(allowed)} (Modality), got {v}")
    return allowed[v]


def _grids(grid: object, name: str, merge: int) -> list[tuple[int, int, int]]:
    """``[N, 3]`` integer ``(t, h, w)`` rows, each positive with ``h, w`` divisible by the
    spatial merge (the processor pools ``merge x merge`` patches into one token)."""
    if not isinstance(grid, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor [N, 3], got {type(grid).__name__}")
    if grid.is_floating_point() or grid.is_complex() or grid.dtype == torch.bool:
        raise TypeError(f"{name}: expected an integer tensor, got {grid.dtype}")
    if grid.ndim not in (1, 2) or grid.shape[-1] != 3:
        raise ValueError(f"{name}: expected shape [N, 3] (t, h, w), got {tuple(grid.shape)}")
    rows = [tuple(int(x) for x in g) for g in grid.reshape(-1, 3).tolist()]
    for i, (t, h, w) in enumerate(rows):
        if min(t, h, w) < 1 or h % merge or w % merge:
            raise ValueError(
                f"{name}[{i}]: expected positive (t, h, w) with h and w multiples of "
                f"spatial_merge_size={merge}, got {(t, h, w)}"
            )
    return rows


def _one_sequence(x: torch.Tensor, name: str) -> torch.Tensor:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(x).__name__}")
    if x.ndim == 2 and x.shape[0] == 1:
        x = x[0]
    if x.ndim != 1:
        raise ValueError(
            f"{name}: expected one sequence [S] or [1, S], got shape {tuple(x.shape)} "
            "(build one layout per batch row)"
        )
    return x


def _runs(mod: torch.Tensor, value: int) -> list[tuple[int, int]]:
    """Maximal runs ``(start, length)`` of ``mod == value``."""
    hit = (mod == value).to(torch.int8)
    if not bool(hit.any()):
        return []
    d = torch.diff(torch.cat([hit.new_zeros(1), hit, hit.new_zeros(1)]))
    starts = torch.nonzero(d == 1).flatten().tolist()
    ends = torch.nonzero(d == -1).flatten().tolist()
    return [(s, e - s) for s, e in zip(starts, ends)]


def _split_runs(runs: list[tuple[int, int]], sizes: list[int], name: str) -> list[tuple[int, int]]:
    """Cut runs into consecutive items of ``sizes`` (adjacent items may share one run)."""
    out, i = [], 0
    for start, n in runs:
        pos = start
        while n > 0:
            if i >= len(sizes) or sizes[i] > n:
                raise ValueError(f"{name}: item sizes {sizes} do not tile the token runs {runs}")
            out.append((pos, sizes[i]))
            pos += sizes[i]
            n -= sizes[i]
            i += 1
    if i != len(sizes):
        raise ValueError(f"{name}: {len(sizes)} items but the tokens hold only {i}")
    return out
