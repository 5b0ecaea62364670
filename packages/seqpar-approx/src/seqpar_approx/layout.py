"""Where every token of one sequence lives across hosts.

The sequence ``[0, n)`` is: the anchor block ``[0, l_a)``, the context ``[l_a, n - n_q)`` and the
query block ``[n - n_q, n)`` (the text after the video). The context is cut into ``V`` virtual
blocks (``V = 2H`` with ZigZag, else ``H``), contiguous and in order. Lengths that do not divide
evenly are split as evenly as possible: the first ``len % V`` blocks get one token more.
With ZigZag, physical host ``h`` holds virtual blocks ``h`` and ``2H-1-h``; otherwise block ``h``.

Every host holds the whole anchor and query blocks. A host's *local sequence* is, in order:
the anchor, its virtual blocks in ascending order, the query. ``local_indices(h)`` gives the
global position of each local row (the permutation); ``unshard`` undoes it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .config import SpavaConfig


def even_split(total: int, parts: int) -> list[int]:
    """``parts`` lengths summing to ``total``; the first ``total % parts`` are one longer."""
    for name, val, lo in (("total", total, 0), ("parts", parts, 1)):
        if isinstance(val, bool) or not isinstance(val, int) or val < lo:
            raise ValueError(f"{name}: expected an int >= {lo}, got {val!r}")
    base, extra = divmod(total, parts)
    return [base + (1 if i < extra else 0) for i in range(parts)]


def split_frames(num_frames: int, num_hosts: int) -> list[range]:
    """Eq. 6: host ``h`` encodes ``F // H + [h < F % H]`` consecutive frames."""
    ok = all(not isinstance(x, bool) and isinstance(x, int) for x in (num_frames, num_hosts))
    if not ok or num_frames < 0 or num_hosts < 1:
        raise ValueError(
            f"expected ints num_frames >= 0 and num_hosts >= 1, got {num_frames!r} and "
            f"{num_hosts!r}"
        )
    out, start = [], 0
    for n in even_split(num_frames, num_hosts):
        out.append(range(start, start + n))
        start += n
    return out


@dataclass(frozen=True)
class SpavaLayout:
    """The resolved split of one sequence (see the module docstring)."""

    seq_len: int
    query_len: int
    anchor_len: int
    passing_len: int
    num_hosts: int
    zigzag: bool
    block_bounds: tuple[int, ...]  # V + 1 global boundaries of the virtual blocks
    anchor_bounds: tuple[int, ...]  # H + 1 boundaries of the anchor slices (query attention)

    @property
    def num_virtual(self) -> int:
        return len(self.block_bounds) - 1

    @property
    def context_end(self) -> int:
        return self.seq_len - self.query_len

    def block(self, v: int) -> tuple[int, int]:
        return self.block_bounds[v], self.block_bounds[v + 1]

    def block_len(self, v: int) -> int:
        a, b = self.block(v)
        return b - a

    def passing_count(self, v: int) -> int:
        """Essential KVs virtual block ``v`` sends: ``min(l_p, len(block v))``."""
        return min(self.passing_len, self.block_len(v))

    def virtual_of_host(self, h: int) -> tuple[int, ...]:
        if not 0 <= h < self.num_hosts:
            raise ValueError(f"host: expected 0 <= h < {self.num_hosts}, got {h}")
        if self.zigzag:
            return (h, 2 * self.num_hosts - 1 - h)
        return (h,)

    def host_of_virtual(self, v: int) -> int:
        if self.zigzag:
            return v if v < self.num_hosts else 2 * self.num_hosts - 1 - v
        return v

    def anchor_slice(self, h: int) -> tuple[int, int]:
        return self.anchor_bounds[h], self.anchor_bounds[h + 1]

    def local_segments(self, h: int) -> list[tuple[str, int, int]]:
        """``(kind, start, end)`` global ranges of host ``h``'s local rows, in local order."""
        segs = []
        if self.anchor_len:
            segs.append(("anchor", 0, self.anchor_len))
        for v in self.virtual_of_host(h):
            segs.append(("block", *self.block(v)))
        if self.query_len:
            segs.append(("query", self.context_end, self.seq_len))
        return segs

    def local_len(self, h: int) -> int:
        return sum(e - s for _, s, e in self.local_segments(h))

    def local_indices(self, h: int, device: torch.device | str = "cpu") -> torch.Tensor:
        """Global position of each local row of host ``h`` (int64)."""
        parts = [torch.arange(s, e, device=device) for _, s, e in self.local_segments(h)]
        return torch.cat(parts)

    def shard(self, x: torch.Tensor, h: int, *, dim: int) -> torch.Tensor:
        """Host ``h``'s local rows of a full-sequence tensor (``x.shape[dim] == seq_len``)."""
        if not -x.ndim <= dim < x.ndim:
            raise ValueError(
                f"shard: expected a dim of x in [{-x.ndim}, {x.ndim}), got {dim} "
                f"(x shape {tuple(x.shape)})"
            )
        if x.shape[dim] != self.seq_len:
            raise ValueError(
                f"shard: expected size {self.seq_len} at dim {dim}, got {tuple(x.shape)}"
            )
        return x.index_select(dim, self.local_indices(h, x.device))

    def unshard(self, parts: list[torch.Tensor], *, dim: int) -> torch.Tensor:
        """Inverse of :meth:`shard`: the full sequence from every host's local rows.

        Rows held by several hosts (anchor, query) are taken from the first host listing them.
        """
        if len(parts) != self.num_hosts:
            raise ValueError(f"unshard: expected {self.num_hosts} parts, got {len(parts)}")
        shape = list(parts[0].shape)
        shape[dim] = self.seq_len
        out = parts[0].new_empty(shape)
        filled = torch.zeros(self.seq_len, dtype=torch.bool)
        for h, p in enumerate(parts):
            idx = self.local_indices(h)
            if p.shape[dim] != idx.numel():
                raise ValueError(
                    f"unshard: host {h} expected {idx.numel()} rows at dim {dim}, got {p.shape[dim]}"
                )
            keep = ~filled[idx]
            out.index_copy_(
                dim, idx[keep].to(p.device), p.index_select(dim, keep.nonzero()[:, 0].to(p.device))
            )
            filled[idx] = True
        return out


def build_layout(seq_len: int, *, query_len: int, config: SpavaConfig) -> SpavaLayout:
    """Resolve ``config`` for one sequence of ``seq_len`` tokens whose last ``query_len`` are the query.

    Raises ``ValueError`` when the context (between the anchor and the query) has fewer tokens than
    virtual hosts: the video is too short for this many hosts (use fewer hosts or a shorter anchor).
    """
    for name, val in (("seq_len", seq_len), ("query_len", query_len)):
        if isinstance(val, bool) or not isinstance(val, int):
            raise TypeError(f"{name}: expected an int, got {type(val).__name__}")
    if query_len < 0 or query_len >= seq_len:
        raise ValueError(f"query_len: expected 0 <= query_len < seq_len={seq_len}, got {query_len}")
    if not isinstance(config, SpavaConfig):
        raise TypeError(f"config: expected a SpavaConfig, got {type(config).__name__}")
    l_a, l_p = config.resolved(seq_len)
    V = config.num_virtual
    ctx = seq_len - query_len - l_a
    if ctx < V:
        raise ValueError(
            f"sequence too short for {config.num_hosts} hosts: the context between the anchor "
            f"({l_a} tokens) and the query ({query_len} tokens) has {max(ctx, 0)} tokens, need at "
            f"least {V} (one per virtual host); use fewer hosts, more frames or a shorter anchor"
        )
    bounds = [l_a]
    for n in even_split(ctx, V):
        bounds.append(bounds[-1] + n)
    abounds = [0]
    for n in even_split(l_a, config.num_hosts):
        abounds.append(abounds[-1] + n)
    return SpavaLayout(
        seq_len=seq_len,
        query_len=query_len,
        anchor_len=l_a,
        passing_len=l_p,
        num_hosts=config.num_hosts,
        zigzag=config.zigzag,
        block_bounds=tuple(bounds),
        anchor_bounds=tuple(abounds),
    )


def ring_layout(seq_len: int, *, num_hosts: int) -> SpavaLayout:
    """ZigZag ring attention's split: ``2H`` chunks of the whole sequence, no anchor, no query."""
    cfg = SpavaConfig(num_hosts=num_hosts, anchor_len=0, passing_len=0, zigzag=True)
    return build_layout(seq_len, query_len=0, config=cfg)
