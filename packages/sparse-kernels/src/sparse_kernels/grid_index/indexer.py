"""The Grid index of a layer in one sequence of launches, with the state kept across layers.

:class:`GridIndexer` launches the fold pass (interior and edge segments in one launch), its
merge, the stride and phase search, the permutation with each block's index and the block lists
with their run split, into one int32 allocation, with no host read. The lists are launched
before the read of their width, as wide as the widest seen for the shape (the read then waits
for every kernel, and nothing is launched after it); a wider row (the first call of a shape, or
a wider stride choice) is launched again after the read. With a width on record, the launches
are a CUDA graph (:class:`~.graphs.OffsetGraph`) captured for the shape and replayed for every
layer: one host call instead of five launches and their host work.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence

import torch

from ..estimate.search import host_to_device, stride_vector
from ..permuted.perms import host_ints
from .graphs import OffsetGraph
from .lists import grid_candidate_lists
from .reference import grid_window
from .settings import DEFAULT_SETTINGS, GridIndexSettings
from .types import GridIndex, RunSplit

_GRAPHS = ("auto", "off")


class PendingGridIndex:
    """A launched Grid index whose list width the host has not read yet.

    ``stride``, ``phase`` (int64 ``[B, H]``), ``perm`` (int32 ``[B, H, S]``) and ``kv_runs``
    (int32 ``[B, H, NB]``) are final (device tensors, possibly still being computed).
    ``early`` is the index with the lists launched before the read (as wide as the widest
    seen for the shape), or None; :meth:`result` reads the width (one host read) and returns
    ``early`` itself when its lists are exactly that wide."""

    __slots__ = ("early", "kv_runs", "perm", "phase", "stride", "_result")

    def __init__(self, stride, phase, perm, kv_runs, early, result):
        self.stride, self.phase, self.perm, self.kv_runs = stride, phase, perm, kv_runs
        self.early = early
        self._result = result

    def result(self) -> GridIndex:
        """The index with its lists (waits for the device: one host read of the widths)."""
        return self._result()


def _head_pairs(use_vline, use_slash, H: int) -> tuple[tuple[bool, bool], ...]:
    """Per head ``(use_vline, use_slash)`` from a bool or ``H`` bools each."""
    cols = []
    for name, x in (("use_vline", use_vline), ("use_slash", use_slash)):
        if isinstance(x, bool):
            cols.append((x,) * H)
        elif isinstance(x, Sequence) and len(x) == H and all(isinstance(v, bool) for v in x):
            cols.append(tuple(x))
        else:
            raise TypeError(f"{name}: expected a bool or a sequence of H={H} bools, got {x!r}")
    return tuple(zip(*cols))


def _flags_key(use_vline, use_slash, H: int) -> tuple:
    """The line flags as a cache key: the two bools when one pair serves every head (no per-head
    tuple made per call), else the per-head pairs."""
    if isinstance(use_vline, bool) and isinstance(use_slash, bool):
        return (use_vline, use_slash)
    return _head_pairs(use_vline, use_slash, H)


@functools.lru_cache(maxsize=64)
def _head_flags(key: tuple, H: int, B: int, device: torch.device) -> torch.Tensor:
    """int32 ``[2, B * H]`` on ``device`` (b-major) from :func:`_flags_key`, made once per
    value."""
    pairs = (key,) * H if isinstance(key[0], bool) else key
    return host_to_device(torch.tensor(pairs, dtype=torch.int32).T.repeat(1, B), device)


class GridIndexer:
    """Grid indexes of one shape after another, with what it learns kept across calls: the widest
    list row seen per shape and the CUDA graphs of the launches per shape (bounded).

    Args:
        graphs: ``"auto"`` (replay a captured CUDA graph on CUDA, for sequences of up to
            ``graph_max_tokens``, once a width for the shape is on record) or ``"off"``
            (launch every call).
        settings: the kernels' launch settings (:class:`GridIndexSettings`).
        lists_cap_bytes: the early lists are launched for shapes whose three lists take at most
            this many bytes.
        max_graphs: graphs kept (the oldest is dropped); each holds its workspace and outputs
            (at 128K tokens about 20 MB).
        graph_max_tokens: longest sequence indexed through a graph: a replay copies its outputs
            (the permutation and lists, 4 bytes per head and token and more), and at 1M tokens
            on an H100 that copy made the graph 0.2 ms slower than the launches, whose host
            time the GPU work hides at that length; at 512K
            the graph was still 0.08 ms faster.
    """

    def __init__(
        self,
        *,
        graphs: str = "auto",
        settings: GridIndexSettings = DEFAULT_SETTINGS,
        lists_cap_bytes: int = 256 << 20,
        max_graphs: int = 8,
        graph_max_tokens: int = 1 << 19,
    ):
        if graphs not in _GRAPHS:
            raise ValueError(f"graphs: expected one of {_GRAPHS}, got {graphs!r}")
        if not isinstance(settings, GridIndexSettings):
            raise TypeError(
                f"settings: expected a GridIndexSettings, got {type(settings).__name__}"
            )
        for name, val in (
            ("lists_cap_bytes", lists_cap_bytes), ("max_graphs", max_graphs),
            ("graph_max_tokens", graph_max_tokens),
        ):  # fmt: skip
            if isinstance(val, bool) or not isinstance(val, int) or val < 0:
                raise ValueError(f"{name}: expected an int >= 0, got {val!r}")
        self.graphs = graphs
        self.settings = settings
        self.lists_cap_bytes = lists_cap_bytes
        self.max_graphs = max_graphs
        self.graph_max_tokens = graph_max_tokens
        self._lists_cap: dict[tuple, int] = {}
        self._graphs: dict[tuple, OffsetGraph] = {}

    def __repr__(self) -> str:
        return (
            f"GridIndexer(graphs={self.graphs!r}, settings={self.settings}, "
            f"{len(self._graphs)} graphs, {len(self._lists_cap)} widths on record)"
        )

    def start(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        *,
        strides: tuple[int, ...],
        last_q: int,
        block: int,
        use_vline: bool | Sequence[bool] = True,
        use_slash: bool | Sequence[bool] = True,
        scale: float,
        rel_tol: float = 0.15,
    ) -> PendingGridIndex:
        """Launch the Grid index of ``q``, ``k`` (see :func:`~sparse_kernels.grid_index.grid_index`
        for the arguments; ``strides`` ascending, inputs already checked there or by the
        caller: this is the per-layer path and checks only what it adds)."""
        from .lists_triton import grid_lists_size, launch_grid_lists

        B, H, S, _ = q.shape
        n = min(last_q, S)
        q_rows = q.narrow(2, S - n, n)
        dev = q.device
        P = math.lcm(*strides)
        nb = -(-S // block)
        N = B * H
        flags = _flags_key(use_vline, use_slash, H)
        key = (N, S, block, strides, dev)
        cap = self._lists_cap.get(key, 0)
        fits = self._graphs_fit(dev, S, q_rows, k)
        launch_for = functools.partial(
            _launch, S=S, P=P, scale=scale, strides=stride_vector(strides, dev),
            max_stride=strides[-1], block=block, flags=_head_flags(flags, H, B, dev),
            rel_tol=rel_tol, settings=self.settings,
        )  # fmt: skip

        def graph_for(c: int) -> OffsetGraph | None:
            """The graph of the launches with lists ``c`` wide, captured if missing (None while
            the stream is being captured by someone else)."""
            gkey = (key, c, flags, scale, rel_tol, OffsetGraph.key_of(q_rows, k))
            graph = self._graphs.get(gkey)
            if graph is None and not torch.cuda.is_current_stream_capturing():
                if len(self._graphs) >= self.max_graphs:
                    del self._graphs[next(iter(self._graphs))]  # the oldest
                try:
                    graph = OffsetGraph(functools.partial(launch_for, cap=c), q_rows, k)
                except Exception as e:
                    raise RuntimeError(
                        f"capturing the Grid index's CUDA graph failed ({e}); with "
                        f"GridIndexer(graphs='off') it launches its kernels on every call instead"
                    ) from e
                self._graphs[gkey] = graph
            return graph

        # A graph is captured by the call that records a width (in result(), after its read: a
        # call that launches its lists again anyway), so that a timed later call only replays it.
        graph = graph_for(cap) if cap and fits else None
        if graph is not None:
            outs, read = graph(q_rows, k), graph.read
        else:
            _, outs, widths = launch_for(q_rows, k, None, cap=cap)
            read = functools.partial(host_ints, widths)
        st, ph, perm, runs_bh, kmin, qmax, s_lo, s_hi, runs, v_hi, widths, *lists = outs
        early = None
        if lists:
            idx, cnt, rest, rc, starts, sc = lists
            early = GridIndex(
                st, ph, perm, runs_bh, idx, cnt, RunSplit(rest, rc, starts, sc), block
            )

        def result() -> GridIndex:
            wv, ws = read()
            w = wv + ws + 1
            if early is not None and w <= cap:
                return early if w == cap else _narrow(early, w)
            if w > self.settings.lists_max_width:
                idx, cnt = grid_candidate_lists(
                    v_hi, s_lo, s_hi, kmin, qmax, wv, ws, nb, impl="reference"
                )
                split = None
            else:
                idx, cnt, split = launch_grid_lists(
                    v_hi, s_lo, s_hi, kmin, qmax, widths, w, nb, runs=runs,
                    block_w=self.settings.lists_block_w,
                )  # fmt: skip
                split = RunSplit(*(t.view(B, H, *t.shape[1:]) for t in split))
                if grid_lists_size(N, nb, w) * 4 <= self.lists_cap_bytes:
                    self._lists_cap[key] = w
                    if fits:
                        graph_for(w)
            return GridIndex(
                st, ph, perm, runs_bh, idx.view(B, H, nb, -1), cnt.view(B, H, nb), split, block
            )

        return PendingGridIndex(st, ph, perm, runs_bh, early, result)

    def _graphs_fit(self, dev: torch.device, S: int, q: torch.Tensor, k: torch.Tensor) -> bool:
        """Whether a graph is replayed on ``dev`` for ``S`` tokens: on CUDA, up to
        ``graph_max_tokens``, with ``q`` and ``k`` of one dtype and unit last strides (a graph's
        fold kernel reads them in place)."""
        if self.graphs != "auto" or dev.type != "cuda" or self.graph_max_tokens < S:
            return False
        return q.stride(-1) == 1 and k.stride(-1) == 1 and q.dtype == k.dtype


def _narrow(index: GridIndex, W: int) -> GridIndex:
    """``index`` with the first ``W`` entries of each list (views)."""
    s = index.run_split
    return GridIndex(
        index.stride, index.phase, index.perm, index.kv_runs, index.block_indices[..., :W],
        index.block_counts, RunSplit(s.rest_idx[..., :W], s.rest_cnt, s.run_starts[..., :W],
                                     s.run_cnt), index.block,
    )  # fmt: skip


def _launch(
    q_rows: torch.Tensor,
    k: torch.Tensor,
    qk_offsets: torch.Tensor | None,
    *,
    S: int,
    P: int,
    scale: float,
    strides: torch.Tensor,
    max_stride: int,
    block: int,
    cap: int,
    flags: torch.Tensor,
    rel_tol: float,
    settings: GridIndexSettings,
) -> tuple[torch.Tensor, tuple[torch.Tensor, ...], torch.Tensor]:
    """The launches of :meth:`GridIndexer.start`: ``(base, (stride [B, H], phase [B, H],
    perm [B, H, S], runs [B, H, NB], kmin, qmax, s_lo, s_hi, runs, v_hi, widths[, idx, cnt,
    rest, rest_cnt, starts, run_cnt]), widths)``, every output a view of ``base`` (one int32
    allocation): the block index as ``grid_blocks_triton`` gives it (``[B * H, ...]``) and
    what the index keeps shaped as it keeps it (the lists ``[B, H, NB, cap]`` when ``cap``;
    shaped here, so that a graph replay makes these views for free). No host read;
    ``qk_offsets``: as :func:`~.fold_launch.fold_partials` takes it (an :class:`OffsetGraph`)."""
    # The Triton modules are imported on use: importing sparse_kernels must not import triton
    # (TRITON_INTERPRET is read when triton is imported).
    from .blocks_triton import grid_blocks_size, grid_blocks_triton
    from .fold_launch import fold_partials
    from .lists_triton import grid_lists_size, launch_grid_lists
    from .search_triton import search_partials

    B, H, n, _ = q_rows.shape
    N = B * H
    lo, hi = grid_window(P, S)
    # The fold pass first: the host work below runs while the GPU computes it.
    col, sl, seg = fold_partials(
        q_rows, k, S - n, period=P, lo=lo, hi=hi, scale=scale, qk_offsets=qk_offsets,
        settings=settings,
    )  # fmt: skip
    nb = -(-S // block)
    n_blocks = grid_blocks_size(N, S, block)
    n_lists = grid_lists_size(N, nb, cap) if cap else 0
    # One allocation (each costs host time): strides and phases (int64), the block index, the
    # lists.
    size = 4 * N + n_blocks + n_lists
    size += size % 2  # a whole number of int64 (a graph views a copy of it as int64 too)
    base = torch.empty(size, dtype=torch.int32, device=q_rows.device)
    buf = base[4 * N : 4 * N + n_blocks]
    st, ph, _ = search_partials(
        col, sl, seg, P, S - n, strides, rel_tol, zero=buf[-2:],
        out=base[: 4 * N].view(torch.int64).view(2, N),
    )  # fmt: skip
    perm, blocks, v_hi, widths = grid_blocks_triton(
        S, st, ph, flags[0], flags[1], block, max_stride, buf=buf
    )
    kmin, qmax, s_lo, s_hi, runs = blocks.unbind()
    bh = lambda t: t.view(B, H, *t.shape[1:])  # noqa: E731
    outs = (st.view(B, H), ph.view(B, H), bh(perm), bh(runs), kmin, qmax, s_lo, s_hi, runs, v_hi)
    outs += (widths,)
    if cap:
        idx, cnt, rest = launch_grid_lists(
            v_hi, s_lo, s_hi, kmin, qmax, widths, cap, nb, runs=runs,
            buf=base[4 * N + n_blocks : 4 * N + n_blocks + n_lists],
            block_w=settings.lists_block_w,
        )  # fmt: skip
        outs += tuple(map(bh, (idx, cnt, *rest)))
    return base, outs, widths
