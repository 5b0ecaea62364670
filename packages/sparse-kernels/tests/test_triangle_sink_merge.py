"""The sink-merge kernel (the FA4 triangle engine's sink part): a windowed attention's result plus
the sink keys before the window, merged in place, equals the triangle pattern's A-shape rows."""

import pytest
import torch
from sparse_kernels.attention import masked_attention_reference
from sparse_kernels.testing import assert_close_budget, default_device, kernel_dtypes, make_qkv
from sparse_kernels.triangle import triangle_attention_reference
from sparse_kernels.triangle.sink_merge_triton import launch_sink_merge_

DEV = default_device()


def _window_only(q, k, v, window, scale):
    """Attention over the local window alone (what FA4's window_size=(window - 1, 0) computes)."""
    S_Q, S_KV = q.shape[2], k.shape[2]
    p = torch.arange(S_Q, device=q.device)[:, None] + (S_KV - S_Q)
    j = torch.arange(S_KV, device=q.device)[None, :]
    return masked_attention_reference(q, k, v, (j <= p) & (p - j < window), scale=scale)


# (B, H, H_KV, S_Q, S_KV, D, sink, window, bshd)
CASES = [
    (1, 4, 2, 150, 150, 64, 8, 32, False),
    (2, 2, 1, 97, 200, 64, 40, 50, True),
    (1, 2, 2, 120, 70, 32, 16, 8, False),
    (1, 3, 1, 64, 64, 80, 100, 1, True),
]


@pytest.mark.parametrize("dtype", kernel_dtypes(), ids=str)
@pytest.mark.parametrize("B,H,H_KV,S_Q,S_KV,D,sink,window,bshd", CASES, ids=str)
def test_sink_merge_gives_the_a_shape_rows(B, H, H_KV, S_Q, S_KV, D, sink, window, bshd, dtype):
    q, k, v = make_qkv(B, H, H_KV, S_Q, S_KV, D, dtype=dtype, device=DEV, seed=S_Q + sink)
    scale = D**-0.5
    win = _window_only(q, k, v, window, scale)
    if bshd:  # FA4's output layout: the [B, H, S, D] view of a [B, S, H, D] buffer
        out = win.out.transpose(1, 2).contiguous().transpose(1, 2)
    else:
        out = win.out.clone()
    lse = win.lse.clone()
    row_lo = max(0, window - (S_KV - S_Q))
    launch_sink_merge_(
        out, lse, q, k, v, sink=sink, window=window, row_lo=row_lo, row_hi=S_Q, scale=scale
    )
    shape = dict(sink=sink, window=window, last=0, scale=scale)
    gold = triangle_attention_reference(q, k, v, **shape, compute_dtype=torch.float64)
    low = triangle_attention_reference(q, k, v, **shape, compute_dtype=q.dtype)
    assert_close_budget(out, low.out, gold.out, dtype=dtype, name="out")
    assert_close_budget(lse, low.lse, gold.lse, dtype=torch.float32, floor=1e-3, name="lse")
    # Rows before row_lo are left exactly as the window gave them.
    assert torch.equal(out[:, :, :row_lo], win.out[:, :, :row_lo])
