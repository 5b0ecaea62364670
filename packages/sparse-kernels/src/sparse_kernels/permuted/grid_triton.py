"""The Grid permutation and its inverse in one Triton pass (no gather, no scatter).

Line ``c`` of a head with stride ``st`` and phase ``ph`` (``0 <= ph < st``) holds the tokens
``i = (ph + c) mod st + k*st``; with ``q, r = divmod(S, st)`` it starts at permuted position
``start(c) = c*q + #{c' < c : (ph + c') mod st < r}``, which is arithmetic. Each program writes,
for a block of ``i``: ``inverse[i] = start((i - ph) mod st) + i // st``, and ``perm[i]`` from the
line found by a binary search of ``start`` (``STEPS`` halvings of ``[0, st)``).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

_BLOCK = 1024


@triton.jit
def _line_start(c, ph, st, q, r):
    """First permuted position of line ``c`` (``0 <= c <= st``; ``start(st) == S``)."""
    x = ph + c  # < 2 * st: the count of t in [0, x) with t mod st < r needs no division
    fx = tl.where(x < st, tl.minimum(x, r), r + tl.minimum(x - st, r))
    return c * q + fx - tl.minimum(ph, r)


@triton.jit
def _grid_permutation_fwd_kernel(
    st_ptr, ph_ptr, perm_ptr, inv_ptr, S, BLOCK: tl.constexpr, STEPS: tl.constexpr
):
    pid = tl.program_id(0)
    n = tl.program_id(1)
    st = tl.load(st_ptr + n)
    ph = tl.load(ph_ptr + n)
    q = S // st
    r = S - q * st
    i = pid * BLOCK + tl.arange(0, BLOCK)
    ok = i < S
    row = n.to(tl.int64) * S
    c = (i - ph + st) % st
    tl.store(inv_ptr + row + i, _line_start(c, ph, st, q, r) + i // st, mask=ok)
    lo = tl.zeros([BLOCK], dtype=tl.int32)
    hi = lo + st
    for _ in range(STEPS):  # invariant: start(lo) <= i < start(hi)
        mid = (lo + hi) // 2
        take = _line_start(mid, ph, st, q, r) <= i
        lo = tl.where(take, mid, lo)
        hi = tl.where(take, hi, mid)
    first = tl.where(ph + lo < st, ph + lo, ph + lo - st)
    tl.store(perm_ptr + row + i, first + st * (i - _line_start(lo, ph, st, q, r)), mask=ok)


def _launch_grid_permutation_fwd(
    S: int, stride: torch.Tensor, phase: torch.Tensor, max_stride: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(perm, inverse)`` int32 ``[H, S]``. ``stride``/``phase``: int ``[H]`` on one device,
    strides in ``1 .. max_stride`` (not checked here), phases any integer."""
    H = stride.shape[0]
    st = stride.to(torch.int32).contiguous()
    ph = torch.remainder(phase.to(torch.int64), stride.to(torch.int64)).to(torch.int32).contiguous()
    perm = torch.empty(H, S, dtype=torch.int32, device=stride.device)
    inv = torch.empty_like(perm)
    steps = max(1, int(max_stride).bit_length())
    _grid_permutation_fwd_kernel[(triton.cdiv(S, _BLOCK), H)](
        st, ph, perm, inv, S, BLOCK=_BLOCK, STEPS=steps
    )
    return perm, inv
