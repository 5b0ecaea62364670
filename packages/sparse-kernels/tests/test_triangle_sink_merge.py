"""The sink-merge kernel (the FA4 triangle engine's sink part): a windowed attention's result plus
the sink keys before the window, merged in place, equals the triangle pattern's A-shape rows."""

import pytest
import torch
from sparse_kernels.attention import masked_attention_reference
from sparse_kernels.testing import assert_close_budget, default_device, kernel_dtypes, make_qkv
from sparse_kernels.triangle import triangle_attention_reference
from sparse_kernels.triangle.sink_merge_triton import _launch_sink_merge_fwd

DEV = default_device()


def _window_only(q, k, v, window, scale):
    """Attention over the local window alone (what FA4's window_size=(window - 1, 0) computes)."""
    S_Q, S_KV = q.shape[2], k.shape[2]
    p = torch.arange(S_Q, device=q.device)[:, None] + (S_KV - S_Q)
    j = torch.arange(S_KV, device=q.device)[None, :]
    return masked_attention_reference(q, k, v, (j <= p) & (p - j < window), scale=scale)


# (B, H, H_KV, S_Q, S_KV, D, sink, window, bshd, rows left after row_hi)
CASES = [
    (1, 4, 2, 150, 150, 64, 8, 32, False, 0),
    (2, 2, 1, 97, 200, 64, 40, 50, True, 20),
    (1, 2, 2, 120, 70, 32, 16, 8, False, 33),
    (1, 3, 1, 64, 64, 80, 100, 1, True, 0),
]


@pytest.mark.parametrize("dtype", kernel_dtypes(), ids=str)
@pytest.mark.parametrize("B,H,H_KV,S_Q,S_KV,D,sink,window,bshd,tail", CASES, ids=str)
def test_sink_merge_gives_the_a_shape_rows(
    B, H, H_KV, S_Q, S_KV, D, sink, window, bshd, tail, dtype
):
    q, k, v = make_qkv(B, H, H_KV, S_Q, S_KV, D, dtype=dtype, device=DEV, seed=S_Q + sink)
    scale = D**-0.5
    win = _window_only(q, k, v, window, scale)
    if bshd:  # FA4's output layout: the [B, H, S, D] view of a [B, S, H, D] buffer
        out = win.out.transpose(1, 2).contiguous().transpose(1, 2)
    else:
        out = win.out.clone()
    lse = win.lse.clone()
    row_lo, row_hi = max(0, window - (S_KV - S_Q)), S_Q - tail
    _launch_sink_merge_fwd(
        out, lse, q, k, v, sink=sink, window=window, row_lo=row_lo, row_hi=row_hi, scale=scale
    )
    shape = dict(sink=sink, window=window, last=0, scale=scale)
    gold = triangle_attention_reference(q, k, v, **shape, compute_dtype=torch.float64)
    low = triangle_attention_reference(q, k, v, **shape, compute_dtype=q.dtype)
    rows = slice(0, row_hi)
    assert_close_budget(out[:, :, rows], low.out[:, :, rows], gold.out[:, :, rows], dtype=dtype)
    assert_close_budget(
        lse[:, :, rows], low.lse[:, :, rows], gold.lse[:, :, rows], dtype=torch.float32, floor=1e-3
    )
    # Rows outside [row_lo, row_hi) are left exactly as the window gave them.
    for outside in (slice(0, row_lo), slice(row_hi, S_Q)):
        assert torch.equal(out[:, :, outside], win.out[:, :, outside])
        assert torch.equal(lse[:, :, outside], win.lse[:, :, outside])
