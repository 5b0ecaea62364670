"""The attention step a Spava host runs on its own rows: dense, TriangleMix or MMInference.

A host computes attention for *segments*: the anchor rows, and the rows of each of its virtual
blocks. A segment is a contiguous global range ``[start, start + S)`` whose rows attend

* ``k_prefix``/``v_prefix``: keys that precede every row of the segment (for a block: the
  anchor, then the passing blocks; for the anchor: none), and
* the segment's own keys ``k``/``v``, causally.

A step is any :class:`HostAttention`. The three here, and exactly what a row attends with each
(the key order is the host's: prefix, then the segment):

* :class:`DenseHost`: every prefix key and every causal segment key (Spava as published).
* :class:`TriangleHost`: TriangleMix's A-shape over the host's keys in that order, i.e.
  ``sparse_kernels.triangle_attention`` with ``last=0`` on the concatenation: the first ``sink``
  keys (the start of the anchor) and the ``window`` keys ending at the diagonal. The dense
  "last rows" of TriangleMix are Spava's query block, which stays exact outside these steps.
* :class:`MMInferenceHost`: the prefix keys (all of them, or with ``prefix=PrefixBlocks(...)``
  the key blocks that ``seqpar_approx.prefix_blocks`` selects per head) and, over the segment's
  own keys, the plan of a
  ``sparse_patterns.MMInferencePlanner`` for the layer's per-head patterns, estimated on the segment's
  rows with the global modality of its tokens (``token_layout[start : start + S]``). The two
  partials are merged by LSE, so the result is exact for that key set. A segment of at most
  ``max(block, dense_rows)`` rows (one block of the plan, or a segment whose planning costs more
  than dense attention over it, e.g. Spava's anchor) attends its own keys densely (causally).

:class:`HostSparsity` picks the step of each layer from a ``PatternConfig`` (MMInference) and/or a
``LayerPolicy`` (TriangleMix: ``"dense"``, ``"triangle"``/``"streaming"``, and ``"dynamic"`` =
MMInference).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

import torch
from sparse_kernels import AttentionOutput, attention, merge_attention, triangle_attention

from .prefix_blocks import PrefixBlocks
from .timing import SectionTimer, section


@runtime_checkable
class HostAttention(Protocol):
    """One segment's attention (module docstring). ``q [B, H, S, D]``; ``k, v [B, H_KV, S, D]``;
    ``k_prefix, v_prefix [B, H_KV, P, D]`` (``P`` may be 0); ``start``: the global position of the
    segment's first row. ``timer``: where a step counts its own ``"estimation"`` time. Returns the
    segment rows' ``AttentionOutput``."""

    def __call__(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        k_prefix: torch.Tensor,
        v_prefix: torch.Tensor,
        *,
        start: int,
        scale: float,
        impl: str,
        timer: SectionTimer | None = None,
    ) -> AttentionOutput: ...


def _require(module: str):
    """Import ``module`` (sparse_patterns / triangle_mix), naming the extra that installs it."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise ImportError(
            f"sparse host attention needs {module}: pip install 'seqpar-approx[sparse]'"
        ) from e


def _cat(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return b if a.shape[2] == 0 else torch.cat([a, b], dim=2)


@dataclass(frozen=True)
class DenseHost:
    """Dense causal attention over prefix + segment (Spava's own step)."""

    def __call__(
        self, q, k, v, k_prefix, v_prefix, *, start, scale, impl, timer=None
    ) -> AttentionOutput:
        del start, timer
        return attention(
            q, _cat(k_prefix, k), _cat(v_prefix, v), causal=True, scale=scale, impl=impl
        )


DENSE = DenseHost()


@dataclass(frozen=True)
class TriangleHost:
    """A-shape (``sink`` first keys + ``window`` keys to the diagonal) over prefix + segment."""

    sink: int
    window: int

    def __post_init__(self) -> None:
        for name, lo in (("sink", 0), ("window", 1)):
            val = getattr(self, name)
            if isinstance(val, bool) or not isinstance(val, int) or val < lo:
                raise ValueError(f"TriangleHost.{name}: expected an int >= {lo}, got {val!r}")

    def __call__(
        self, q, k, v, k_prefix, v_prefix, *, start, scale, impl, timer=None
    ) -> AttentionOutput:
        del start, timer
        return triangle_attention(
            q,
            _cat(k_prefix, k),
            _cat(v_prefix, v),
            sink=self.sink,
            window=self.window,
            last=0,
            scale=scale,
            impl=impl,
        )


@dataclass(frozen=True)
class MMInferenceHost:
    """The prefix (dense, or ``prefix``'s blocks), MMInference's per-head plan over the
    segment, merged by LSE.

    ``heads``: one ``HeadConfig`` per query head (a ``PatternConfig`` layer).
    ``token_layout``: the global ``sparse_patterns.TokenLayout`` of the whole sequence (None: all
    text). ``block``: the plan's block size. ``planner``: the ``sparse_patterns.MMInferencePlanner``
    that plans the segments, of block size ``block`` (None: one made for this host); a
    :class:`HostSparsity` gives every layer's host its own one, so that what the planner keeps
    per shape (the Grid heads' CUDA graphs) serves every layer.
    ``prefix``: a :class:`~seqpar_approx.prefix_blocks.PrefixBlocks` (None: every prefix key).
    ``dense_rows``: segments of at most this many rows attend their own keys densely, unplanned
    (0: only those of at most ``block`` rows). A plan's host time hardly depends on the
    segment's length, so for a short segment (Spava's anchor, say) dense attention costs less
    (``docs/results.md``, Spava section).
    """

    heads: tuple
    token_layout: object = None
    block: int = 64
    planner: object = field(default=None, compare=False, repr=False)
    prefix: PrefixBlocks | None = None
    dense_rows: int = 0

    def __post_init__(self) -> None:
        sp = _require("sparse_patterns")
        HeadConfig, TokenLayout = sp.HeadConfig, sp.TokenLayout

        if not isinstance(self.heads, tuple) or not self.heads:
            raise TypeError(
                f"MMInferenceHost.heads: expected a non-empty tuple of HeadConfig, got "
                f"{type(self.heads).__name__}"
            )
        bad = [type(h).__name__ for h in self.heads if not isinstance(h, HeadConfig)]
        if bad:
            raise TypeError(f"MMInferenceHost.heads: expected HeadConfig items, got {bad[:3]}")
        if self.token_layout is not None and not isinstance(self.token_layout, TokenLayout):
            raise TypeError(
                f"MMInferenceHost.token_layout: expected a TokenLayout or None, got "
                f"{type(self.token_layout).__name__}"
            )
        if isinstance(self.block, bool) or not isinstance(self.block, int) or self.block < 1:
            raise ValueError(f"MMInferenceHost.block: expected an int >= 1, got {self.block!r}")
        n = self.dense_rows
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise ValueError(f"MMInferenceHost.dense_rows: expected an int >= 0, got {n!r}")
        if self.planner is None:
            object.__setattr__(self, "planner", sp.MMInferencePlanner(block=self.block))
        elif not isinstance(self.planner, sp.MMInferencePlanner):
            raise TypeError(
                f"MMInferenceHost.planner: expected a MMInferencePlanner or None, got "
                f"{type(self.planner).__name__}"
            )
        elif self.planner.block != self.block:
            raise ValueError(
                f"MMInferenceHost.planner: expected a planner of block {self.block}, got block "
                f"{self.planner.block}"
            )
        if self.prefix is not None and not isinstance(self.prefix, PrefixBlocks):
            raise TypeError(
                f"MMInferenceHost.prefix: expected a PrefixBlocks or None, got "
                f"{type(self.prefix).__name__}"
            )

    def segment_layout(self, start: int, length: int):
        """The ``TokenLayout`` of global rows ``[start, start + length)`` (None: all text)."""
        if self.token_layout is None:
            return None
        mod = self.token_layout.modality
        if start + length > mod.shape[0]:
            raise ValueError(
                f"token_layout: expected at least {start + length} tokens (segment "
                f"[{start}, {start + length})), got {mod.shape[0]}"
            )
        return self.token_layout.segment(start, start + length)

    def plan(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        *,
        start: int,
        scale: float,
        exact_vertical_lists: bool = True,
    ):
        """The segment's ``BlockPlan``. ``exact_vertical_lists`` is ``MMInferencePlanner.plan``'s:
        True (default) builds the exact heads' block lists too, so that ``row_mask`` can be read;
        the host's step plans with False, as ``BlockPlan.run`` reads no list of those heads (on
        video, exact Vertical-Slash heads list nearly every block, which would widen the layer's
        index for all heads)."""
        self._check_heads(q)
        lay = self.segment_layout(start, q.shape[2])
        return self.planner.plan(
            q, k, self.heads, lay, scale=scale, exact_vertical_lists=exact_vertical_lists
        )

    def prefix_mask(self, q: torch.Tensor, k_prefix: torch.Tensor, *, scale: float) -> torch.Tensor:
        """``[B, H, S, P]`` bool: the prefix keys each of the segment's rows attends."""
        B, H, S, _ = q.shape
        P = k_prefix.shape[2]
        if self.prefix is None:
            return torch.ones(B, H, S, P, dtype=torch.bool, device=q.device)
        return self.prefix.row_mask(self.prefix.select(q, k_prefix, scale=scale), S, P)

    def _check_heads(self, q: torch.Tensor) -> None:
        if len(self.heads) != q.shape[1]:
            raise ValueError(
                f"MMInferenceHost: expected {len(self.heads)} query heads (one HeadConfig each), "
                f"got q with {q.shape[1]}"
            )

    def __call__(
        self, q, k, v, k_prefix, v_prefix, *, start, scale, impl, timer=None
    ) -> AttentionOutput:
        self._check_heads(q)
        short = q.shape[2] <= max(self.block, self.dense_rows)
        if short and self.prefix is None:
            return DENSE(q, k, v, k_prefix, v_prefix, start=start, scale=scale, impl=impl)
        if short:
            seg = attention(q, k, v, causal=True, scale=scale, impl=impl)
        else:
            with section(timer, "estimation"):
                plan = self.plan(q, k, start=start, scale=scale, exact_vertical_lists=False)
            seg = plan.run(q, k, v, scale=scale, impl=impl)
        if k_prefix.shape[2] == 0:
            return seg
        if self.prefix is None:
            pre = attention(q, k_prefix, v_prefix, causal=False, scale=scale, impl=impl)
        else:
            with section(timer, "estimation"):
                sel = self.prefix.select(q, k_prefix, scale=scale)
            pre = self.prefix.attend(
                q, k_prefix, v_prefix, sel, scale=scale, impl=impl, check_indices=False
            )
        return merge_attention([seg.out, pre.out], [seg.lse, pre.lse], impl=impl)


@dataclass(frozen=True)
class HostSparsity:
    """Which :class:`HostAttention` each layer runs.

    * ``patterns`` only: MMInference in every layer.
    * ``policy`` only: TriangleMix, ``"dense"`` layers dense, ``"triangle"``/``"streaming"``
      layers :class:`TriangleHost` (``policy.sink``, ``policy.window``).
    * both: the policy, with its ``"dynamic"`` layers running MMInference.

    ``patterns`` is a ``sparse_patterns.PatternConfig``; ``policy`` a ``triangle_mix.LayerPolicy``;
    ``prefix``: the :class:`~seqpar_approx.prefix_blocks.PrefixBlocks` of the MMInference layers
    (None: they attend every prefix key). ``dense_rows``: :class:`MMInferenceHost`'s, for every
    MMInference layer.
    """

    patterns: object = None
    policy: object = None
    block: int = 64
    prefix: PrefixBlocks | None = None
    dense_rows: int = 0

    def __post_init__(self) -> None:
        PatternConfig = _require("sparse_patterns").PatternConfig
        LayerPolicy = _require("triangle_mix").LayerPolicy

        if self.patterns is None and self.policy is None:
            raise ValueError("HostSparsity: expected patterns, a policy or both, got neither")
        if self.patterns is not None and not isinstance(self.patterns, PatternConfig):
            raise TypeError(
                f"HostSparsity.patterns: expected a PatternConfig, got "
                f"{type(self.patterns).__name__}"
            )
        if self.policy is not None and not isinstance(self.policy, LayerPolicy):
            raise TypeError(
                f"HostSparsity.policy: expected a LayerPolicy, got {type(self.policy).__name__}"
            )
        if self.policy is not None and self.policy.needs_dynamic and self.patterns is None:
            raise ValueError(
                "HostSparsity: the policy has 'dynamic' layers, expected patterns (a "
                "PatternConfig) for them, got None"
            )
        if self.prefix is not None and not isinstance(self.prefix, PrefixBlocks):
            raise TypeError(
                f"HostSparsity.prefix: expected a PrefixBlocks or None, got "
                f"{type(self.prefix).__name__}"
            )
        if self.prefix is not None and self.patterns is None:
            raise ValueError(
                "HostSparsity: prefix is the MMInference layers' setting, expected patterns (a "
                "PatternConfig) with it, got None"
            )
        n = self.dense_rows
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise ValueError(f"HostSparsity.dense_rows: expected an int >= 0, got {n!r}")
        if n and self.patterns is None:
            raise ValueError(
                "HostSparsity: dense_rows is the MMInference layers' setting, expected patterns "
                f"(a PatternConfig) with dense_rows={n}, got None"
            )
        both = self.policy is not None and self.patterns is not None
        if both and self.policy.num_layers != self.patterns.num_layers:
            raise ValueError(
                f"HostSparsity: expected a policy and patterns of the same depth, got "
                f"{self.policy.num_layers} and {self.patterns.num_layers} layers"
            )

    @property
    def num_layers(self) -> int:
        return (self.policy or self.patterns).num_layers

    def for_layer(self, layer_idx: int, token_layout=None) -> HostAttention:
        """The step of layer ``layer_idx``; ``token_layout`` (a ``TokenLayout`` of the whole
        prompt, or None for text) is what MMInference layers estimate with."""
        if isinstance(layer_idx, bool) or not isinstance(layer_idx, int):
            raise TypeError(f"layer_idx: expected an int, got {type(layer_idx).__name__}")
        if not 0 <= layer_idx < self.num_layers:
            raise ValueError(f"layer_idx: expected 0..{self.num_layers - 1}, got {layer_idx}")
        kind = "dynamic" if self.policy is None else self.policy.kinds[layer_idx]
        if kind == "dense":
            return DENSE
        if kind in ("triangle", "streaming"):
            return TriangleHost(sink=self.policy.sink, window=self.policy.window)
        return MMInferenceHost(
            self.patterns.layer(layer_idx), token_layout=token_layout, block=self.block,
            planner=self.planner, prefix=self.prefix, dense_rows=self.dense_rows,
        )  # fmt: skip

    @functools.cached_property
    def planner(self):
        """The ``sparse_patterns.MMInferencePlanner`` of every MMInference layer (made on first
        use: a policy without them needs no sparse_patterns)."""
        return _require("sparse_patterns").MMInferencePlanner(block=self.block)
