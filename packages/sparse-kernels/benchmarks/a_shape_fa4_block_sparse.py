"""Study: A-shape attention (sink + window) through FA4's block-sparse kernel in one call, against
``triangle_attention(impl="auto")`` (FA4's sliding window, then our sink-merge kernel) and the
Triton kernel, same process, Qwen2.5-VL-7B shape, bf16.

Tiles of 128x128: a tile whose every pair is a sink or window pair (and below the diagonal) is an
FA4 full block; any other tile with a visible pair is a partial block, masked by a CuTe
``mask_mod`` (causal, and key < sink or query - key < window). Outputs are compared, then the
three are timed in turn, three rounds (CUDA-event medians, ms).

    python packages/sparse-kernels/benchmarks/a_shape_fa4_block_sparse.py out.json
"""

import json
import sys

import cutlass
import cutlass.cute as cute
import torch
from flash_attn.cute import flash_attn_func
from flash_attn.cute import utils as fa4_utils
from flash_attn.cute.block_sparsity import BlockSparseTensorsTorch
from sparse_kernels import triangle_attention
from sparse_kernels.benchmark_providers import qwen_inputs
from sparse_kernels.benchmarking import cuda_time_ms, env_info

BLOCK = 128


def sink_or_window(sink: int, window: int):
    @cute.jit
    def mask(batch, head, q_idx, kv_idx, seqlen_info, aux_tensors):
        s = fa4_utils.scalar_to_ssa(sink, cutlass.Int32)
        w = fa4_utils.scalar_to_ssa(window, cutlass.Int32)
        return (kv_idx <= q_idx) & ((kv_idx < s) | (q_idx - kv_idx < w))

    return mask


def lists(S: int, sink: int, window: int, device):
    nb = S // BLOCK
    m = torch.arange(nb, device=device)[:, None]
    n = torch.arange(nb, device=device)[None, :]
    all_window = (m * BLOCK + BLOCK - 1 - n * BLOCK) < window
    all_sink = (n * BLOCK + BLOCK - 1) < sink
    full = (n < m) & (all_window | all_sink)
    any_ = (n <= m) & ((n * BLOCK < sink) | ((m * BLOCK - (n * BLOCK + BLOCK - 1)) < window))
    part = any_ & ~full

    def compact(sel):
        cnt = sel.sum(-1, dtype=torch.int32)
        idx = torch.argsort((~sel).to(torch.int8), dim=-1, stable=True).to(torch.int32)
        w = max(int(cnt.max()), 1)
        return cnt[None, None].contiguous(), idx[..., :w][None, None].contiguous()

    pc, pi = compact(part)
    fc, fi = compact(full)
    return BlockSparseTensorsTorch(
        mask_block_cnt=pc,
        mask_block_idx=pi,
        full_block_cnt=fc,
        full_block_idx=fi,
        block_size=(BLOCK, BLOCK),
    )


def measure(q, k, v, S: int, sink: int, window: int) -> dict:
    """Check the FA4 call against ``impl="auto"``, then time the three (ms)."""
    scale = q.shape[-1] ** -0.5
    tensors = lists(S, sink, window, q.device)
    mask = sink_or_window(sink, window)
    bshd = [x.transpose(1, 2) for x in (q, k, v)]

    def fa4_bs():
        with torch.no_grad():
            return flash_attn_func(
                *bshd, softmax_scale=scale, causal=False, mask_mod=mask,
                block_sparse_tensors=tensors, return_lse=True,
            )  # fmt: skip

    def ours(impl):
        return lambda: triangle_attention(
            q, k, v, sink=sink, window=window, last=0, scale=scale, impl=impl
        )

    ref = ours("auto")()
    o, lse = fa4_bs()
    r = {
        "S": S, "sink": sink, "window": window,
        "partial_tiles": int(tensors.mask_block_cnt.sum()),
        "full_tiles": int(tensors.full_block_cnt.sum()),
        "max_abs_diff_out": (o.transpose(1, 2).float() - ref.out.float()).abs().max().item(),
        "max_abs_diff_lse": (lse - ref.lse).abs().max().item(),
    }  # fmt: skip
    rep = 30 if S <= 32768 else 10
    calls = (("ours_auto", ours("auto")), ("fa4_block_sparse_mask", fa4_bs),
             ("ours_triton", ours("triton")))  # fmt: skip
    for _ in range(3):
        for name, fn in calls:
            r.setdefault(name + "_ms", []).append(cuda_time_ms(fn, warmup=3, rep=rep))
    r["fa4_bs_over_ours_auto"] = min(r["ours_auto_ms"]) / min(r["fa4_block_sparse_mask_ms"])
    return r


def main():
    res = {"env": env_info(), "rows": []}
    for S in (32768, 131072):
        q, k, v = qwen_inputs(S)
        for sink, window in ((8, 512), (128, 4096)):
            res["rows"].append(measure(q, k, v, S, sink, window))
            print(json.dumps(res["rows"][-1]), flush=True)
        torch.cuda.empty_cache()
    with open(sys.argv[1], "w") as f:
        json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
