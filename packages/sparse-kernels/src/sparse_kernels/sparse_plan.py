"""``SparsePlan``: the one typed sparse format that crosses the package boundary.

Size: one type; its field checks, the BlockMask conversions and the dense reference of the
attended set belong together.

A plan says which (query, key) pairs an attention launch computes, for ``[B', H']`` heads
(``B'``, ``H'`` in ``{1, B}``, ``{1, H}``: size 1 broadcasts). Its block lists are in
FlexAttention's ``BlockMask`` layout; optional per-head permutations reorder rows and columns
before the blocks are cut (MMInference's Grid and boundary heads); optional run lists and
per-pair modality masks are the two refinements the permuted kernel executes. Planners build
plans, :func:`~sparse_kernels.permuted_block_sparse_attention` executes them, ``to_dense`` is the
exact reference of the attended set.

Construction checks shapes, dtypes, devices and block sizes (Python only, no device work). The
content checks (permutations, ranges, duplicates) read the device back once, so they are a
separate step: ``check_contents=True`` at construction (the default) or :meth:`SparsePlan.check`;
planners that build valid plans pass ``check_contents=False`` and stay free of host syncs.
"""

from __future__ import annotations

import functools
from dataclasses import InitVar, dataclass

import torch

from .permuted import checks
from .permuted.perms import inverse_permutation
from .permuted.reference import block_list_mask, dense_mask

_INT = (torch.int32, torch.int64)


def _fail_type(name: str, want: str, got: object) -> TypeError:
    return TypeError(f"SparsePlan.{name}: expected {want}, got {got}")


def _positive_pair(name: str, value: object, label: str) -> tuple[int, int]:
    """An int ``n`` (as ``(n, n)``) or a pair of ints, each >= 1."""
    pair = (value, value) if isinstance(value, int) and name == "block_size" else value
    ok = isinstance(pair, (tuple, list)) and len(pair) == 2
    if not ok or any(isinstance(x, bool) or not isinstance(x, int) for x in pair):
        raise _fail_type(name, f"a pair of ints {label}", repr(value))
    if min(pair) < 1:
        raise ValueError(f"SparsePlan.{name}: expected ints >= 1 {label}, got {tuple(pair)}")
    return int(pair[0]), int(pair[1])


def _tensor(name: str, t: object, dtypes: tuple, device: torch.device | None) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise _fail_type(name, "a torch.Tensor", type(t).__name__)
    if t.dtype not in dtypes:
        want = " or ".join(str(d).removeprefix("torch.") for d in dtypes)
        raise _fail_type(name, f"dtype {want}", t.dtype)
    if device is not None and t.device != device:
        raise ValueError(
            f"SparsePlan.{name}: expected a tensor on {device} (kv_indices' device), got {t.device}"
        )
    return t


def _shape(name: str, t: torch.Tensor, ok: bool, want: str) -> None:
    if not ok:
        raise ValueError(f"SparsePlan.{name}: expected shape {want}, got {tuple(t.shape)}")


def _both(names: tuple[str, ...], values: tuple) -> bool:
    """All of ``values`` given (True) or none (False); raise if only some are."""
    given = [v is not None for v in values]
    if any(given) and not all(given):
        got = ", ".join(f"{n}={'a tensor' if g else 'None'}" for n, g in zip(names, given))
        want = "both or neither" if len(names) == 2 else "all or none"
        raise ValueError(f"SparsePlan: {' and '.join(names)}: expected {want}, got {got}")
    return all(given)


@dataclass(frozen=True, eq=False, repr=False, kw_only=True)
class SparsePlan:
    """Which pairs an attention launch computes, in FlexAttention ``BlockMask`` layout.

    Semantics (exact; :meth:`to_dense` builds it). Permuted query row ``r`` is original row
    ``q_perm[r]``, permuted key column ``c`` original key ``kv_perm[c]`` (None: identity). Row
    ``r`` attends column ``c`` iff block ``(r // block_m, c // block_n)`` is listed for its
    (batch, head) and

    * it is in the partial list (the first ``kv_num_blocks[b, h, m]`` entries of
      ``kv_indices[b, h, m]``) and, if ``causal``, the original key is visible from the original
      query: ``kv_perm[c] <= q_perm[r] + S_KV - S_Q``; with pair masks also bit
      ``q_modality[i] * 8 + kv_modality[j]`` of the entry's ``kv_block_pairs`` value is set; or
    * it is in the full list (``full_kv_*``): no element mask at all (FlexAttention's full
      blocks: the builder promises every pair there is wanted).

    A run-list entry ``s`` of permuted query block ``m`` adds the original keys
    ``s + i * kv_run_step`` (``i < block_n``, below ``S_KV``) for its rows, under the partial
    list's causal rule: the kernel computes their positions instead of reading ``kv_perm``.

    Fields (all tensors on one device; ``B'`` / ``H'`` are 1 or the batch / head count):
        kv_num_blocks: int32 ``[B', H', NQB]``, ``NQB = ceil(S_Q / block_m)``.
        kv_indices: int32 ``[B', H', NQB, W]``: PERMUTED key block numbers in
            ``[0, ceil(S_KV / block_n))``, each at most once per query block over both lists.
        seq_lengths: ``(S_Q, S_KV)``. block_size: ``(block_m, block_n)`` (an int: both).
        causal: the partial list's causal rule on original positions.
        full_kv_num_blocks, full_kv_indices: the full list, both or neither, same layout.
        q_perm: int32 ``[S_Q]``, ``[H'|1, S_Q]`` or ``[B'|1, H'|1, S_Q]``, kept as a 3-D view;
            kv_perm likewise over ``S_KV``, its heads per query head, per KV head or shared.
        q_perm_inv, kv_perm_inv: their exact inverses when the builder has them (e.g.
            :func:`~sparse_kernels.grid_permutation`'s ``inverse``); else :attr:`q_inverse` /
            :attr:`kv_inverse` compute them on first use (a scatter, no host read).
        kv_run_starts: int32 ``[B', H', NQB, R]`` original positions, kv_run_counts int32
            ``[B', H', NQB]`` (both or neither); kv_run_step: an int >= 1 or an int tensor
            ``[B'|1, H'|1]`` (kept as int64).
        q_modality, kv_modality: int ``[S]`` or ``[B'|1, S]`` modality ids in ``[0, 8)`` of the
            ORIGINAL tokens (kept 2-D); kv_block_pairs: int64 (or int32) pair masks shaped like
            ``kv_indices``. All three or none; not together with run lists.
        check_contents: run :meth:`check` at construction (one host read).
    """

    kv_num_blocks: torch.Tensor
    kv_indices: torch.Tensor
    seq_lengths: tuple[int, int]
    block_size: tuple[int, int]
    causal: bool = True
    full_kv_num_blocks: torch.Tensor | None = None
    full_kv_indices: torch.Tensor | None = None
    q_perm: torch.Tensor | None = None
    kv_perm: torch.Tensor | None = None
    q_perm_inv: torch.Tensor | None = None
    kv_perm_inv: torch.Tensor | None = None
    kv_run_starts: torch.Tensor | None = None
    kv_run_counts: torch.Tensor | None = None
    kv_run_step: int | torch.Tensor = 1
    q_modality: torch.Tensor | None = None
    kv_modality: torch.Tensor | None = None
    kv_block_pairs: torch.Tensor | None = None
    check_contents: InitVar[bool] = True

    def __post_init__(self, check_contents: bool) -> None:
        put = functools.partial(object.__setattr__, self)
        put("block_size", _positive_pair("block_size", self.block_size, "(block_m, block_n)"))
        put("seq_lengths", _positive_pair("seq_lengths", self.seq_lengths, "(S_Q, S_KV)"))
        for name, value in (("causal", self.causal), ("check_contents", check_contents)):
            if not isinstance(value, bool):
                raise _fail_type(name, "a bool", f"{type(value).__name__} {value!r:.40}")
        dev = _tensor("kv_indices", self.kv_indices, (torch.int32,), None).device
        # (name, (batch, heads)) of every tensor: each size must be 1 or one common size.
        lead = self._check_lists(dev)
        lead += self._check_perms(dev, put)
        lead += self._check_runs(dev, put)
        lead += self._check_pairs(dev, put)
        for dim, what in ((0, "batch"), (1, "heads")):
            sizes = {n: s[dim] for n, s in lead}
            if any(v not in (1, max(sizes.values())) for v in sizes.values()):
                raise ValueError(
                    f"SparsePlan: {what} dims must be 1 or one common size, got "
                    + ", ".join(f"{n}: {v}" for n, v in sizes.items())
                )
        if check_contents:
            self.check()

    def _check_list(self, cname: str, iname: str, dev: torch.device) -> tuple:
        """A padded list ``[B', H', NQB, W]`` and its counts ``[B', H', NQB]``, int32."""
        nqb = self.num_q_blocks
        indices = _tensor(iname, getattr(self, iname), (torch.int32,), dev)
        _shape(iname, indices, indices.ndim == 4 and indices.shape[2] == nqb,
               f"[B', H', NQB={nqb}, W]")  # fmt: skip
        counts = _tensor(cname, getattr(self, cname), (torch.int32,), dev)
        want = tuple(indices.shape[:3])
        _shape(cname, counts, tuple(counts.shape) == want, f"{list(want)} (as {iname})")
        return iname, tuple(indices.shape[:2])

    def _check_lists(self, dev: torch.device) -> list:
        lead = [self._check_list("kv_num_blocks", "kv_indices", dev)]
        full = ("full_kv_num_blocks", "full_kv_indices")
        if _both(full, (self.full_kv_num_blocks, self.full_kv_indices)):
            lead.append(self._check_list(*full, dev))
        return lead

    def _check_perms(self, dev: torch.device, put) -> list:
        """Permutations and given inverses: int32 ``[S]``, ``[heads, S]`` or ``[B', heads, S]``,
        kept as 3-D views."""
        lead = []
        for side, S in (("q", self.seq_lengths[0]), ("kv", self.seq_lengths[1])):
            if getattr(self, f"{side}_perm") is None:
                if getattr(self, f"{side}_perm_inv") is not None:
                    raise ValueError(f"SparsePlan.{side}_perm_inv: expected None without "
                                     f"{side}_perm, got a tensor")  # fmt: skip
                continue
            for name in (f"{side}_perm", f"{side}_perm_inv"):
                t = getattr(self, name)
                if t is not None:
                    _tensor(name, t, (torch.int32,), dev)
                    _shape(name, t, 1 <= t.ndim <= 3 and t.shape[-1] == S,
                           f"[{S}], [heads, {S}] or [B', heads, {S}]")  # fmt: skip
                    put(name, t.reshape((1,) * (3 - t.ndim) + tuple(t.shape)))
            perm, inv = getattr(self, f"{side}_perm"), getattr(self, f"{side}_perm_inv")
            if inv is not None and inv.shape != perm.shape:
                raise ValueError(
                    f"SparsePlan.{side}_perm_inv: expected the shape of {side}_perm "
                    f"{tuple(perm.shape)}, got {tuple(inv.shape)}"
                )
            # kv_perm's heads may be the KV heads: they take part in the batch check only.
            lead.append((f"{side}_perm", perm.shape[:2] if side == "q" else (perm.shape[0], 1)))
        return lead

    def _check_runs(self, dev: torch.device, put) -> list:
        lead = []
        if _both(("kv_run_starts", "kv_run_counts"), (self.kv_run_starts, self.kv_run_counts)):
            lead.append(self._check_list("kv_run_counts", "kv_run_starts", dev))
        step = self.kv_run_step
        if isinstance(step, bool) or not isinstance(step, (int, torch.Tensor)):
            raise _fail_type("kv_run_step", "an int or an int tensor", type(step).__name__)
        if isinstance(step, int) and step < 1:
            raise ValueError(f"SparsePlan.kv_run_step: expected an int >= 1, got {step}")
        if isinstance(step, torch.Tensor):
            _tensor("kv_run_step", step, _INT, dev)
            _shape("kv_run_step", step, step.ndim == 2, "[B'|1, H'|1]")
            lead.append(("kv_run_step", tuple(step.shape)))
            put("kv_run_step", step.to(torch.int64))
        return lead

    def _check_pairs(self, dev: torch.device, put) -> list:
        """Modality ids ``[S]`` or ``[B', S]`` (kept 2-D) and pair masks shaped like the list."""
        names = ("q_modality", "kv_modality", "kv_block_pairs")
        if not _both(names, (self.q_modality, self.kv_modality, self.kv_block_pairs)):
            return []
        lead = []
        for name, S in (("q_modality", self.seq_lengths[0]), ("kv_modality", self.seq_lengths[1])):
            t = _tensor(name, getattr(self, name), _INT, dev)
            _shape(name, t, t.ndim in (1, 2) and t.shape[-1] == S, f"[{S}] or [B', {S}]")
            put(name, t.reshape(-1, S))
            lead.append((name, (getattr(self, name).shape[0], 1)))
        pm = _tensor("kv_block_pairs", self.kv_block_pairs, _INT, dev)
        want = self.kv_indices.shape
        _shape("kv_block_pairs", pm, pm.shape == want, f"{tuple(want)} (kv_indices')")
        if self.kv_run_starts is not None:
            raise NotImplementedError(
                "SparsePlan: a run list (kv_run_starts) takes no pair masks; got "
                "kv_block_pairs too (keep the blocks that need pair masks in kv_indices)"
            )
        return lead

    def _perm(self, side: str) -> torch.Tensor | None:
        return self.q_perm if side == "q" else self.kv_perm

    # -- sizes ------------------------------------------------------------------------------

    @property
    def device(self) -> torch.device:
        return self.kv_indices.device

    @property
    def num_q_blocks(self) -> int:
        return -(-self.seq_lengths[0] // self.block_size[0])

    @property
    def num_kv_blocks(self) -> int:
        return -(-self.seq_lengths[1] // self.block_size[1])

    @functools.cached_property
    def batch(self) -> int:
        """``B'``: the batch size the plan's tensors broadcast to (1: one plan for every entry)."""
        ts = [self.kv_indices, self.full_kv_indices, self.q_perm, self.kv_perm,
              self.kv_run_starts, self.q_modality, self.kv_modality]  # fmt: skip
        if isinstance(self.kv_run_step, torch.Tensor):
            ts.append(self.kv_run_step)
        return max(t.shape[0] for t in ts if t is not None)

    @functools.cached_property
    def heads(self) -> int:
        """``H'``: the query heads of the lists, ``q_perm`` and run steps (1: shared)."""
        ts = [self.kv_indices, self.full_kv_indices, self.q_perm, self.kv_run_starts]
        if isinstance(self.kv_run_step, torch.Tensor):
            ts.append(self.kv_run_step)
        return max(t.shape[1] for t in ts if t is not None)

    # -- inverses ---------------------------------------------------------------------------

    @functools.cached_property
    def q_inverse(self) -> torch.Tensor | None:
        """``q_perm_inv`` if given, else the inverse of ``q_perm`` made now (None: identity)."""
        if self.q_perm is None or self.q_perm_inv is not None:
            return self.q_perm_inv
        return inverse_permutation(self.q_perm)

    @functools.cached_property
    def kv_inverse(self) -> torch.Tensor | None:
        """``kv_perm_inv`` if given, else the inverse of ``kv_perm`` made now (None: identity)."""
        if self.kv_perm is None or self.kv_perm_inv is not None:
            return self.kv_perm_inv
        return inverse_permutation(self.kv_perm)

    # -- content checks ---------------------------------------------------------------------

    def check(self) -> SparsePlan:
        """Check the contents and return the plan: permutations are permutations of
        ``0..S-1`` (and given inverses their inverses), counts within the lists' widths, listed
        blocks in ``[0, NKB)``, no key block twice for one query block over both lists, run
        starts in ``[0, S_KV)``, run steps >= 1, modality ids in ``[0, 8)``. Vectorised on the
        plan's device; one host read (more only to word an error). Raises ``ValueError``."""
        checks.raise_first(checks.plan_checks(self))
        return self

    # -- conversions ------------------------------------------------------------------------

    @classmethod
    def from_block_mask(cls, block_mask, *, causal: bool = True, check_contents: bool = True,
                        **extra) -> SparsePlan:  # fmt: skip
        """A plan of a FlexAttention ``BlockMask``'s lists, block size and sequence lengths.

        Its ``mask_mod`` is not evaluated: partial blocks take the plan's ``causal`` rule, full
        blocks are attended whole (as FlexAttention attends them). ``extra``: other plan fields
        (permutations, run lists, pair masks). No copies: the plan holds the mask's tensors."""
        bs = getattr(block_mask, "BLOCK_SIZE", None)
        if bs is None or not hasattr(block_mask, "kv_num_blocks"):
            raise TypeError(
                f"SparsePlan.from_block_mask: expected a flex_attention BlockMask, got "
                f"{type(block_mask).__name__}"
            )
        return cls(
            kv_num_blocks=block_mask.kv_num_blocks,
            kv_indices=block_mask.kv_indices,
            full_kv_num_blocks=block_mask.full_kv_num_blocks,
            full_kv_indices=block_mask.full_kv_indices,
            block_size=tuple(bs) if not isinstance(bs, int) else (bs, bs),
            seq_lengths=tuple(block_mask.seq_lengths),
            causal=causal,
            check_contents=check_contents,
            **extra,
        )

    def to_block_mask(self):
        """The plan as a FlexAttention ``BlockMask`` (the same lists, block size and lengths).
        Its ``mask_mod`` agrees with the lists (a listed block, partial ones under the causal
        rule), so eager and compiled ``flex_attention`` both compute :meth:`to_dense`.

        Raises ``NotImplementedError`` for a plan a ``BlockMask`` cannot express: a non-identity
        permutation (identity ones are checked by one host read and dropped), run lists, or pair
        masks."""
        from torch.nn.attention.flex_attention import BlockMask

        for name in ("kv_run_starts", "kv_block_pairs"):
            if getattr(self, name) is not None:
                raise NotImplementedError(
                    f"SparsePlan.to_block_mask: the plan has {name}; a BlockMask cannot express "
                    f"it, run the plan with permuted_block_sparse_attention"
                )
        for side in ("q", "kv"):
            p = self._perm(side)
            S = p.shape[-1] if p is not None else 0
            if p is not None and not bool((p == torch.arange(S, device=p.device)).all()):
                raise NotImplementedError(
                    f"SparsePlan.to_block_mask: the plan has a non-identity {side}_perm (Grid or "
                    f"boundary heads); a BlockMask cannot express it, run the plan with "
                    f"permuted_block_sparse_attention"
                )
        nkb = self.num_kv_blocks
        S_Q, S_KV = self.seq_lengths
        bm, bn = self.block_size
        partial = block_list_mask(self.kv_indices, self.kv_num_blocks, nkb)
        full = torch.zeros_like(partial)
        if self.full_kv_indices is not None:
            full = block_list_mask(self.full_kv_indices, self.full_kv_num_blocks, nkb)
        partial, full = torch.broadcast_tensors(partial, full)
        partial, full = partial.contiguous(), full.contiguous()
        one_b, one_h = partial.shape[0] == 1, partial.shape[1] == 1
        causal, shift = self.causal, S_KV - S_Q

        def listed(b, h, q_idx, kv_idx):
            b, h = (b * 0 if one_b else b), (h * 0 if one_h else h)
            at = (b, h, q_idx // bm, kv_idx // bn)
            keep = partial[at] & (kv_idx <= q_idx + shift) if causal else partial[at]
            return keep | full[at]

        def lists(t, pad: bool):
            # FlexAttention's kernels take contiguous lists NKB wide (copies only when not).
            if t is not None and pad and t.shape[-1] < nkb:
                t = torch.nn.functional.pad(t, (0, nkb - t.shape[-1]))
            return None if t is None else t.contiguous()

        return BlockMask.from_kv_blocks(
            lists(self.kv_num_blocks, False), lists(self.kv_indices, True),
            lists(self.full_kv_num_blocks, False), lists(self.full_kv_indices, True),
            BLOCK_SIZE=self.block_size, mask_mod=listed, seq_lengths=self.seq_lengths,
        )  # fmt: skip

    def to_dense(self, *, heads: int | None = None) -> torch.Tensor:
        """bool ``[B', H, S_Q, S_KV]``: what each ORIGINAL query attends, in original key order
        (exactly what the kernel computes; see the class docstring). ``heads``: the query head
        count ``H`` (default the largest head dim of the plan, ``kv_perm``'s included); a
        ``kv_perm`` of fewer heads than ``H`` is per KV head (``H`` a multiple of them)."""
        H = max(self.heads, self.kv_perm.shape[1] if self.kv_perm is not None else 1)
        if heads is not None:
            if isinstance(heads, bool) or not isinstance(heads, int) or heads < 1:
                raise ValueError(f"SparsePlan.to_dense: heads: expected an int >= 1, got {heads!r}")
            if self.heads not in (1, heads):
                raise ValueError(
                    f"SparsePlan.to_dense: heads: expected the plan's H'={self.heads} (any "
                    f"count only when its lists are shared, H'=1), got {heads}"
                )
            H = heads
        kh = self.kv_perm.shape[1] if self.kv_perm is not None else 1
        if H % kh != 0:
            raise ValueError(
                f"SparsePlan.to_dense: kv_perm has {kh} heads; expected heads (H={H}) to be a "
                f"multiple of them (pass heads=)"
            )
        return dense_mask(self, H)

    # -- display ----------------------------------------------------------------------------

    def __repr__(self) -> str:
        def desc(t) -> str:
            if t is None:
                return "None"
            if isinstance(t, int):
                return str(t)
            return f"{str(t.dtype).removeprefix('torch.')}{list(t.shape)}"

        parts = [f"seq_lengths={self.seq_lengths}", f"block_size={self.block_size}",
                 f"causal={self.causal}", f"device={self.device}"]  # fmt: skip
        for name in ("kv_num_blocks", "kv_indices", "full_kv_num_blocks", "full_kv_indices",
                     "q_perm", "q_perm_inv", "kv_perm", "kv_perm_inv", "kv_run_starts",
                     "kv_run_counts", "kv_run_step", "q_modality", "kv_modality",
                     "kv_block_pairs"):  # fmt: skip
            value = getattr(self, name)
            if value is not None and not (name == "kv_run_step" and self.kv_run_starts is None):
                parts.append(f"{name}={desc(value)}")
        return f"SparsePlan({', '.join(parts)})"
