"""Permutation helpers for the permuted kernels: the Grid permutation and exact inverses."""

from __future__ import annotations

from typing import NamedTuple

import torch

from .._validate import resolve_impl


class Permutation(NamedTuple):
    """A permutation and its exact inverse, both int32 with the same shape ``[..., S]``.

    ``perm[..., r]`` is the ORIGINAL index of the token at permuted position ``r``;
    ``inverse[..., i]`` is the permuted position of original token ``i``
    (``perm[inverse[i]] == i`` and ``inverse[perm[r]] == r``).
    """

    perm: torch.Tensor
    inverse: torch.Tensor


def inverse_permutation(perm: torch.Tensor) -> torch.Tensor:
    """Exact inverse of a permutation along the last dim (same dtype/device/shape)."""
    ar = torch.arange(perm.shape[-1], device=perm.device, dtype=perm.dtype).expand_as(perm)
    return torch.empty_like(perm).scatter_(-1, perm.long(), ar)


def _as_head_vector(x: object, name: str, device: torch.device | None) -> torch.Tensor:
    if isinstance(x, bool):
        raise TypeError(f"{name}: expected an int or an int tensor [H], got bool")
    if isinstance(x, int):
        if not -(2**63) <= x < 2**63:
            raise ValueError(
                f"{name}: expected an int64 value, got an int of {x.bit_length()} bits"
            )
        return torch.tensor([x], dtype=torch.int64, device=device)
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name}: expected an int or an int tensor [H], got {type(x).__name__}")
    if x.dtype.is_floating_point or x.dtype == torch.bool or x.is_complex():
        raise TypeError(f"{name}: expected an integer tensor, got dtype {x.dtype}")
    if x.ndim != 1 or x.numel() == 0:
        raise ValueError(f"{name}: expected a 1-D tensor [H], H >= 1, got shape {tuple(x.shape)}")
    return x.to(device=device if device is not None else x.device, dtype=torch.int64)


def _as_device(device: torch.device | str | None) -> torch.device:
    if device is None:
        return torch.device("cpu")
    try:
        return torch.device(device)
    except (RuntimeError, TypeError) as e:
        raise ValueError(
            f"device: expected a torch device (e.g. 'cuda', 'cpu'), got {device!r}"
        ) from e


def grid_permutation(
    S: int,
    stride: int | torch.Tensor,
    phase: int | torch.Tensor = 0,
    *,
    device: torch.device | str | None = None,
    offsets: torch.Tensor | None = None,
    impl: str = "auto",
) -> Permutation:
    """The Grid permutation of MMInference, for every head at once (no per-head Python loop).

    Tokens are ordered by the key ``((i - phase) mod stride, i)``: first the grid line of the tokens
    ``phase, phase + stride, phase + 2*stride, ...`` (and, wrapping, ``phase - stride, ...``
    before them in index order), then the line ``phase + 1 + k*stride``, and so on; inside a
    line, tokens keep their original order (so causality stays monotone along a line). Tokens on
    one grid line are contiguous in permuted order, which turns the strided lines of a Grid head
    into dense tiles. Line ``c`` (``0 <= c < stride``) holds ``#{i < S : (i - phase) mod stride == c}``
    tokens, see :func:`grid_line_offsets`.

    Args:
        S: sequence length (>= 1).
        stride: grid stride (e.g. tokens per frame), an int or an int tensor ``[H]``; >= 1.
        phase: grid phase (offset of line 0), an int or an int tensor ``[H]``; any integer, taken
            modulo the stride.
        device: where the result lives (default: the device of a tensor argument, else CPU).
        offsets: :func:`grid_line_offsets` of the same arguments, when the caller has it
            (computed here otherwise). The strides are then checked on the device
            (``torch._assert_async``: an error without making the host wait for the values).
        impl: ``"triton"`` (one pass that writes both arrays, arithmetic line starts),
            ``"reference"`` (torch ops: a gather of ``offsets``, then a scatter for the
            inverse) or ``"auto"`` (triton on CUDA). Both give identical results.

    Returns:
        ``Permutation(perm, inverse)``, int32, shape ``[H, S]`` (``H = 1`` for int arguments,
        else the length of the tensor arguments, which must agree or be 1).
    """
    if isinstance(S, bool) or not isinstance(S, int):
        raise TypeError(f"S: expected an int, got {type(S).__name__}")
    if not 1 <= S < 2**31:  # the permutation and its inverse are int32
        raise ValueError(f"S: expected an int in [1, 2**31) (int32 positions), got {S}")
    if device is None:
        for x in (stride, phase):
            if isinstance(x, torch.Tensor):
                device = x.device
                break
    device = _as_device(device)
    st = _as_head_vector(stride, "stride", device)
    ph = _as_head_vector(phase, "phase", device)
    if st.numel() != ph.numel() and 1 not in (st.numel(), ph.numel()):
        raise ValueError(
            f"stride and phase must have the same length H (or 1), got {st.numel()} and {ph.numel()}"
        )
    H = max(st.numel(), ph.numel())
    if offsets is not None and (
        not isinstance(offsets, torch.Tensor) or offsets.ndim != 2 or offsets.shape[0] not in (1, H)
    ):
        got = getattr(offsets, "shape", type(offsets).__name__)
        raise ValueError(f"offsets: expected an int tensor [{H}, W + 1], got {got}")
    if resolve_impl(impl, device, "grid_permutation") == "triton":
        if offsets is not None:  # its width bounds the strides (checked on the device)
            bound = max(offsets.shape[1] - 1, 1)
            _assert_strides(st, bound, "the offsets' width W")
        else:
            bound = _largest_stride(stride, st)
        if bound >= 2**30 or S >= 2**31:
            raise NotImplementedError(
                f"grid_permutation: impl='triton' computes in int32 and needs strides < 2**30 and "
                f"S < 2**31, got a stride bound of {bound} and S={S}; use impl='reference'"
            )
        from ..grid_index.blocks_triton import _launch_grid_permutation_fwd

        return Permutation(*_launch_grid_permutation_fwd(S, st.expand(H), ph.expand(H), bound))
    if offsets is None:
        # A stride >= S orders the tokens as stride S with the phase reduced into the sequence
        # (the tokens from the phase on, then those before it); it keeps the line table at S + 1
        # entries instead of stride + 1.
        ph = torch.remainder(ph.expand(H), st.expand(H).clamp_min(1))  # strides < 1: raised below
        ph = torch.where((st >= S) & (ph >= S), 0, ph)
        st = st.clamp_max(S)
        offs = grid_line_offsets(S, st.expand(H), ph.expand(H), device=device)
    else:
        offs = offsets.to(device=device, dtype=torch.int64)
        _assert_strides(st, max(offs.shape[1] - 1, 1), "the offsets' width W")
    st = st.expand(H)[:, None]
    ph = ph.expand(H)[:, None]
    i = torch.arange(S, device=device, dtype=torch.int64)[None, :]
    line = torch.remainder(i - ph, st)
    # Token i is the (i // stride)-th token of its line (the line's first token is i mod stride),
    # so its permuted position is arithmetic: no sort.
    inverse = (offs.gather(1, line) + torch.div(i, st, rounding_mode="floor")).to(torch.int32)
    return Permutation(inverse_permutation(inverse), inverse)


def grid_line_offsets(
    S: int,
    stride: int | torch.Tensor,
    phase: int | torch.Tensor = 0,
    *,
    device: torch.device | str | None = None,
    max_stride: int | None = None,
) -> torch.Tensor:
    """Where each grid line starts in the permuted order of :func:`grid_permutation`.

    Returns int64 ``[H, W + 1]`` with ``W`` the largest stride: line ``c`` of head ``h``
    occupies permuted positions ``[offsets[h, c], offsets[h, c + 1])``; entries past a head's
    own stride equal ``S``. ``max_stride``: an upper bound on the strides known to the caller;
    then ``W = max_stride`` and the strides are not read back from the device: they are checked
    against ``1 .. max_stride`` there (``torch._assert_async``; on CUDA a device-side assertion
    instead of a synchronisation).
    """
    if device is None:
        for x in (stride, phase):
            if isinstance(x, torch.Tensor):
                device = x.device
                break
    device = torch.device(device) if device is not None else torch.device("cpu")
    st = _as_head_vector(stride, "stride", device)
    ph = _as_head_vector(phase, "phase", device)
    if max_stride is None:
        max_stride = _largest_stride(stride, st)
    else:
        if isinstance(max_stride, bool) or not isinstance(max_stride, int) or max_stride < 1:
            raise ValueError(f"max_stride: expected an int >= 1, got {max_stride!r}")
        _assert_strides(st, max_stride)
    H = max(st.numel(), ph.numel())
    st = st.expand(H)[:, None]
    ph = torch.remainder(ph.expand(H)[:, None], st)
    c = torch.arange(max_stride, device=device, dtype=torch.int64)[None, :]
    # Line c holds the tokens i = first + k*stride < S with first = (phase + c) mod stride.
    first = torch.remainder(ph + c, st)
    count = torch.where(c < st, (S - first + st - 1).clamp_min(0) // st, 0)
    zero = torch.zeros(H, 1, dtype=torch.int64, device=device)
    return torch.cat([zero, torch.cumsum(count, dim=-1)], dim=-1)


def _largest_stride(stride: int | torch.Tensor, st: torch.Tensor) -> int:
    """The largest stride, after checking every stride is >= 1 (``st``: ``stride`` as a head
    vector). Read back from the device unless ``stride`` is a Python int."""
    if isinstance(stride, int):
        if stride < 1:
            raise ValueError(f"stride: expected every value >= 1, got min {stride}")
        return stride
    if bool((st < 1).any()):
        raise ValueError(f"stride: expected every value >= 1, got min {int(st.min())}")
    return int(st.max())


def _assert_strides(st: torch.Tensor, max_stride: int | None, what: str = "max_stride") -> None:
    """Strides in ``1 .. max_stride`` (or >= 1), checked on the strides' device without reading
    them back (on CUDA a failure is a device-side assertion). ``what`` names the bound."""
    ok = st >= 1 if max_stride is None else (st >= 1) & (st <= max_stride)
    bound = "1" if max_stride is None else f"1 and at most {what}={max_stride}"
    torch._assert_async(ok.all(), f"stride: expected every value >= {bound}")


def block_lists_from_mask(
    block_mask: torch.Tensor, *, max_blocks: int | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Block lists (``kv_block_indices``, ``kv_block_counts``) from a bool block mask.

    Args:
        block_mask: bool ``[..., NQB, NKB]`` (e.g. ``[B, H, NQB, NKB]``), True where query block
            ``m`` attends key block ``n``.
        max_blocks: width ``MAXB`` of the index tensor (default: the largest count). A row with
            more listed blocks than ``max_blocks`` raises ``ValueError``.

    Returns:
        int32 ``indices [..., NQB, MAXB]`` (listed blocks first, in increasing order; the padding
        past each count is block 0, a valid number that is never read) and int32
        ``counts [..., NQB]``.
    """
    if not isinstance(block_mask, torch.Tensor) or block_mask.dtype != torch.bool:
        got = (
            block_mask.dtype if isinstance(block_mask, torch.Tensor) else type(block_mask).__name__
        )
        raise TypeError(f"block_mask: expected a bool tensor, got {got}")
    if block_mask.ndim < 2:
        raise ValueError(
            f"block_mask: expected shape [..., NQB, NKB], got {tuple(block_mask.shape)}"
        )
    nkb = block_mask.shape[-1]
    cols = torch.arange(nkb, dtype=torch.int32, device=block_mask.device).expand_as(block_mask)
    idx, counts = compact_by_mask(block_mask, cols)  # width max(1, largest count)
    width = idx.shape[-1] if max_blocks is None else max_blocks
    if max_blocks is not None:
        need = int(counts.max()) if counts.numel() else 0
        if need > width:
            raise ValueError(
                f"max_blocks: a query block lists {need} key blocks, more than max_blocks={width}"
            )
    if width > idx.shape[-1]:
        idx = torch.nn.functional.pad(idx, (0, width - idx.shape[-1]))
    return idx[..., :width].contiguous(), counts


def compact_by_mask(
    mask: torch.Tensor, values: torch.Tensor, *, width: int | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per row of the last dim, the ``values`` where ``mask`` is set, in position order (what a
    stable sort of ``~mask`` would gather), then zeros; by ranks (a cumulative sum), not a sort.

    Args:
        mask: bool ``[..., W]``; values: int ``[..., W]`` (same shape).
        width: output width; None reads the largest count back from the device. A given width
            must hold every row's count (entries past it are dropped).
    Returns:
        int32 ``[..., width or max(1, max count)]`` and int32 counts ``[...]``.
    """
    pos = _running_count(mask)  # 1-based rank of each set entry in its row
    counts = pos[..., -1] if mask.shape[-1] else mask.sum(-1, dtype=torch.int32)
    if width is None:
        width = max(1, *host_ints(counts.max())) if counts.numel() else 1
    out = torch.zeros(*mask.shape[:-1], width + 1, dtype=torch.int32, device=mask.device)
    # Set entries go to their rank; the others to a dropped last column.
    out.scatter_(-1, torch.where(mask, pos - 1, width).long(), values.to(torch.int32))
    return out[..., :width], counts


_NARROW = 128


def _running_count(mask: torch.Tensor) -> torch.Tensor:
    """``mask.cumsum(-1)`` as int32. Rows narrower than ``_NARROW`` are scanned along the leading
    dim of a transposed copy instead: CUDA's innermost-dim scan gives each short row a pass of
    its own (0.66 ms for 114688 rows of 33 at 512K tokens, H100), the outer-dim scan walks all
    rows at once."""
    W = mask.shape[-1]
    if W >= _NARROW or mask.numel() == 0:
        return mask.cumsum(-1, dtype=torch.int32)
    flat = mask.reshape(-1, W).t().contiguous()  # [W, rows]
    return flat.cumsum(0, dtype=torch.int32).t().reshape(mask.shape)


def host_ints(*xs: torch.Tensor) -> list[int]:
    """The values of the one-element tensors ``xs`` (or of one 1-D integer tensor) as Python
    ints, read back together.

    On CUDA this is a synchronisation (the host waits for the queued work). The planners call it
    only for the sizes of outputs that depend on the data (the width of a block list), so that
    a test can tell those reads from accidental ones.
    """
    if len(xs) == 1 and xs[0].ndim == 1:  # already one tensor: no stacking launches
        return [int(v) for v in xs[0].tolist()]
    return torch.stack([x.reshape(()).long() for x in xs]).tolist()


def kv_block_runs(
    kv_perm: torch.Tensor, block_n: int, step: int | torch.Tensor = 1
) -> torch.Tensor:
    """Which key blocks of a permuted order are runs: arithmetic in original positions.

    Args:
        kv_perm: int ``[..., S]`` (``kv_perm[c]`` = original key at permuted column ``c``).
        block_n: key block size.
        step: the run step, an int or an int tensor broadcasting to ``kv_perm.shape[:-1]``
            (1: consecutive keys, as in identity and modality orders; the grid stride: the
            tokens of one grid line).
    Returns:
        int32 ``[..., ceil(S / block_n)]``: the original position ``s`` of the block's first key
        if its keys are ``s, s + step, s + 2 * step, ...``, else -1. A partial last block counts
        only if the next key of its progression would be ``>= S``, so that "the ``block_n`` keys
        ``s + i * step`` below ``S``" is exactly the block.
    """
    S = kv_perm.shape[-1]
    nkb = -(-S // block_n)
    lead = kv_perm.shape[:-1]
    step = torch.as_tensor(step, dtype=torch.int64, device=kv_perm.device).expand(lead)
    pad = nkb * block_n - S
    p = torch.nn.functional.pad(kv_perm.long(), (0, pad), value=-1).reshape(*lead, nkb, block_n)
    i = torch.arange(block_n, device=p.device)
    want = p[..., :1] + i * step[..., None, None]
    # Entries past S (the padding of a partial last block) are not compared; that block also
    # needs its progression to leave the sequence right after it.
    inside = (torch.arange(nkb, device=p.device)[:, None] * block_n + i) < S
    steady = ((p == want) | ~inside).all(-1)
    n_last = S - (nkb - 1) * block_n
    ends = p[..., -1, 0] + n_last * step >= S
    steady[..., -1] &= ends | (n_last == block_n)
    return torch.where(steady, p[..., 0], -1).to(torch.int32)


def split_run_blocks(
    kv_perm: torch.Tensor,
    kv_block_indices: torch.Tensor,
    kv_block_counts: torch.Tensor,
    block_n: int,
    *,
    step: int | torch.Tensor = 1,
    runs: torch.Tensor | None = None,
    width: int | None = None,
    impl: str = "auto",
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Move the listed key blocks that are runs (:func:`kv_block_runs`) to a run list.

    Args:
        kv_perm: int ``[B|1, Hp|1, S_KV]``; kv_block_indices ``[B|1, H|1, NQB, MAXB]`` and
            kv_block_counts ``[B|1, H|1, NQB]`` (their leading dims broadcast with the
            permutation's; ``Hp`` is the lists' head count, i.e. one permutation per listed head).
        step: the runs' step (see :func:`kv_block_runs`); pass the same to the kernel as
            ``kv_run_step``.
        runs: ``kv_block_runs(kv_perm, block_n, step)`` if the caller already has it (it is
            then not recomputed; ``kv_perm`` and ``step`` are not read).
        width: width of both outputs (each must hold its largest count); None reads the largest
            counts back from the device.
        impl: ``"triton"`` (one kernel; needs ``width`` and lists of up to
            ``SPLIT_RUNS_MAX_WIDTH`` entries), ``"reference"`` (torch), ``"auto"`` (triton on CUDA
            when those hold, else torch; the same result either way).
    Returns:
        ``(kv_block_indices, kv_block_counts, kv_run_starts, kv_run_counts)`` for
        :func:`~sparse_kernels.permuted_block_sparse_attention`: the blocks that are not runs,
        then the runs' original start positions; int32, each row in list order. Together they
        attend exactly what the input lists attend.
    """
    from .lists_triton import SPLIT_RUNS_MAX_WIDTH, _launch_split_runs

    if runs is None:
        runs = kv_block_runs(kv_perm, block_n, step)
    nkb = runs.shape[-1]
    lead = torch.broadcast_shapes(runs.shape[:-1], kv_block_indices.shape[:2])
    idx = kv_block_indices.expand(*lead, *kv_block_indices.shape[2:])
    cnt = kv_block_counts.expand(*lead, kv_block_counts.shape[-1])
    W = idx.shape[-1]
    which = resolve_impl(impl, idx.device, "split_run_blocks")
    fits = width is not None and W <= SPLIT_RUNS_MAX_WIDTH
    if which == "triton" and not fits:
        if impl == "triton":
            raise NotImplementedError(
                f"split_run_blocks: impl='triton' needs an output width and lists of up to "
                f"{SPLIT_RUNS_MAX_WIDTH} entries, got width={width}, list width {W}; use "
                f"impl='reference' or 'auto'"
            )
        which = "reference"
    if which == "triton":
        return _launch_split_runs(idx, cnt, runs.expand(*lead, nkb), width)
    valid = torch.arange(W, device=idx.device) < cnt[..., None].long()
    flat = idx.long().clamp(0, nkb - 1).reshape(*lead, -1)
    start = runs.expand(*lead, nkb).gather(-1, flat).reshape(idx.shape)
    is_run = valid & (start >= 0)
    rest_idx, rest_cnt = compact_by_mask(valid & ~is_run, idx, width=width)
    run_starts, run_cnt = compact_by_mask(is_run, start, width=width)
    return rest_idx, rest_cnt, run_starts, run_cnt
