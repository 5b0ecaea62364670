"""Block-sparse attention vs our dense attention and vs FlexAttention on the same BlockMask.

Qwen2.5-7B head shape (B=1, H=28, H_KV=4, D=128), bf16, causal, per-head random block masks
over the causal block triangle (diagonal always kept) at 10% and 30% density, 128x128 blocks.
Blocks strictly below the diagonal are listed as full, diagonal blocks as partial (FlexAttention
evaluates its causal ``mask_mod`` there), so both ops attend exactly the same pairs.
Run: ``nox -s bench -- packages/sparse-kernels/benchmarks/bench_block_sparse.py`` (add ``-s``
for the compact table; it is also written to the terminal summary).
"""

from __future__ import annotations

import functools
import os

import pytest
import torch
from sparse_kernels import attention, block_sparse_attention
from sparse_kernels.benchmarking import (
    attention_flops,
    bench_rounds,
    causal_pairs,
    cudnn_causal,
    record,
    run_benchmark,
)

pytestmark = pytest.mark.gpu

B, H, H_KV, D = 1, 28, 4, 128
BLOCK = 128
ALL_SEQS = {"32K": 32768, "128K": 131072, "512K": 524288, "1M": 1048576}
# SPARSE_KERNELS_BENCH_SEQS=32K,128K,512K picks lengths (default 32K,128K).
SEQS = {n: ALL_SEQS[n] for n in os.environ.get("SPARSE_KERNELS_BENCH_SEQS", "32K,128K").split(",")}
DENSITIES = [0.1, 0.3]
PROVIDERS = ["dense-ours", "sdpa-cudnn", "ours", "flex"]
_RESULTS: dict[tuple[str, float, str], dict] = {}


@functools.cache
def _inputs(S):
    g = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16, generator=g)
    k = torch.randn(B, H_KV, S, D, device="cuda", dtype=torch.bfloat16, generator=g)
    v = torch.randn(B, H_KV, S, D, device="cuda", dtype=torch.bfloat16, generator=g)
    return q, k, v


# From this many blocks per row on (1M tokens), the lists are built one head at a time and cut to
# the longest row, the diagonal list is one entry wide, and the BlockMask gets no q-side lists:
# the [H, NB, NB] int64 sort and FlexAttention's transposed lists do not fit next to a 1M-token
# layer (out of memory on an H100). FlexAttention, which needs the q-side lists, is not run there.
LEAN_NB = 8192


def _lists(sel):
    num = sel.sum(-1, dtype=torch.int32)
    if sel.shape[-1] < LEAN_NB:
        idx = torch.argsort((~sel).to(torch.int8), dim=-1, stable=True).to(torch.int32)
        return num, idx
    width = max(1, int(num.max()))
    idx = torch.stack(
        [
            torch.argsort((~sel[:, h]).to(torch.int8), dim=-1, stable=True)[..., :width].int()
            for h in range(sel.shape[1])
        ],
        dim=1,
    )
    return num, idx


@functools.cache
def _mask(S, density):
    """(BlockMask, attended pairs of all heads, listed fraction) for a random per-head causal
    block pattern."""
    from torch.nn.attention.flex_attention import BlockMask

    nb = S // BLOCK
    g = torch.Generator(device="cuda").manual_seed(int(density * 100))
    m = torch.arange(nb, device="cuda")
    below = m[:, None] > m[None, :]
    diag = m[:, None] == m[None, :]
    # density is the fraction of causal blocks listed (the diagonal counts towards it)
    p = (density * nb * (nb + 1) / 2 - nb) / (nb * (nb - 1) / 2)
    sel = (torch.rand(B, H, nb, nb, device="cuda", generator=g) < p) & below
    fn, fi = _lists(sel)
    lean = nb >= LEAN_NB
    if lean:
        pn = torch.ones(B, H, nb, dtype=torch.int32, device="cuda")
        pi = m.int().reshape(1, 1, nb, 1).expand(B, H, nb, 1).contiguous()
    else:
        pn, pi = _lists(diag.expand(B, H, nb, nb))

    def causal(b, h, q_idx, kv_idx):
        return q_idx >= kv_idx

    bm = BlockMask.from_kv_blocks(
        pn, pi, fn, fi, BLOCK_SIZE=BLOCK, mask_mod=causal, seq_lengths=(S, S),
        compute_q_blocks=not lean,
    )  # fmt: skip
    # attended (query, key) pairs summed over (batch, head)
    pairs = int(sel.sum()) * BLOCK * BLOCK + B * H * nb * BLOCK * (BLOCK + 1) // 2
    listed = (int(sel.sum()) + B * H * nb) / (B * H * nb * (nb + 1) / 2)
    return bm, pairs, listed


def _provider(name, q, k, v, bm):
    if name == "dense-ours":
        return lambda: attention(q, k, v, causal=True).out
    if name == "ours":
        # the mask was validated once below; the timed call skips the index checks
        return lambda: block_sparse_attention(q, k, v, bm, causal=True, check_indices=False).out
    if name == "flex":
        from torch.nn.attention.flex_attention import flex_attention

        flex = torch.compile(flex_attention, dynamic=False)
        return lambda: flex(q, k, v, block_mask=bm, enable_gqa=True)
    if name == "sdpa-cudnn":
        return cudnn_causal(q, k, v)
    raise ValueError(name)


def _chosen_config(q: torch.Tensor, k: torch.Tensor) -> str:
    """The launch config the block-sparse kernel looked up for this call, and where it came from
    (user cache, shipped table, nearest entry or safe config)."""
    from sparse_kernels.block_sparse.triton import SPEC
    from sparse_kernels.tuning.lookup import CHOOSER

    choice = CHOOSER.choose(
        SPEC, device=q.device, head_dim=q.shape[-1], dtype=q.dtype,
        group=q.shape[1] // k.shape[1], seq_len=k.shape[2], variant="causal",
        blocks=(BLOCK, BLOCK),
    )  # fmt: skip
    return f"{choice.config} ({choice.source})"


@pytest.fixture(scope="module", autouse=True)
def _table(request):
    yield
    tr = request.config.pluginmanager.get_plugin("terminalreporter")
    lines = [
        "block_sparse (bf16, B=1 H=28 H_KV=4 D=128, 128x128 blocks, causal)",
        f"{'S':>5} {'dens':>5} {'ours ms':>9} {'flex ms':>9} {'dense ms':>9} "
        f"{'ours/flex':>9} {'useful TF':>9} {'dense TF':>9} {'TF ratio':>8} {'cudnn ms':>9} "
        f"{'cudnn/ours':>10}",
    ]
    for s in SEQS:
        for d in DENSITIES:
            r = {p: _RESULTS.get((s, d, p)) for p in PROVIDERS}
            if r["ours"] is None:
                continue
            ours, flex, dense = r["ours"], r["flex"], r["dense-ours"]
            fl = f"{flex['median_ms']:9.2f}" if flex else f"{'-':>9}"
            de = f"{dense['median_ms']:9.2f}" if dense else f"{'-':>9}"
            sp = f"{flex['median_ms'] / ours['median_ms']:9.2f}" if flex else f"{'-':>9}"
            dtf = dense["useful_tflops"] if dense else float("nan")
            cu = r["sdpa-cudnn"]["median_ms"] if r["sdpa-cudnn"] else float("nan")
            lines.append(
                f"{s:>5} {d:5.2f} {ours['median_ms']:9.2f} {fl} {de} {sp} "
                f"{ours['useful_tflops']:9.1f} {dtf:9.1f} {ours['useful_tflops'] / dtf:8.2f} "
                f"{cu:9.2f} {cu / ours['median_ms']:10.2f}"
            )
    text = "\n".join(lines)
    if tr is not None:
        tr.write_line("")
        for line in lines:
            tr.write_line(line)
    else:
        print(text)


@pytest.mark.parametrize("provider", PROVIDERS)
@pytest.mark.parametrize("density", DENSITIES, ids=lambda d: f"dens{d}")
@pytest.mark.parametrize("seq", list(SEQS))
def test_block_sparse(benchmark, seq, density, provider):
    S = SEQS[seq]
    if provider == "flex" and S // BLOCK >= LEAN_NB:
        pytest.skip("FlexAttention needs the q-side block lists, which do not fit at this length")
    q, k, v = _inputs(S)
    bm, pairs, listed = _mask(S, density)
    if provider in ("dense-ours", "sdpa-cudnn") and density != DENSITIES[0]:
        # one dense timing per length is enough; reuse it for the other densities
        prev = _RESULTS.get((seq, DENSITIES[0], provider))
        if prev is not None:
            _RESULTS[(seq, density, provider)] = prev
        pytest.skip("dense timed once per length")
    fn = _provider(provider, q, k, v, bm)
    out = fn()
    if provider not in ("dense-ours", "sdpa-cudnn"):
        # Correctness on the benchmark shape: ours vs flex on a few heads.
        ref = block_sparse_attention(q, k, v, bm, causal=True, check_indices=True).out
        if provider == "flex":
            err = (out[:, :4].float() - ref[:, :4].float()).norm() / ref[:, :4].float().norm()
            assert err.item() < 2e-2, f"flex vs ours relative error {err.item():.2e}"
    del out
    torch.cuda.reset_peak_memory_stats()
    run_benchmark(benchmark, fn, **bench_rounds(S))
    dense = provider in ("dense-ours", "sdpa-cudnn")
    # pairs is summed over (batch, head); causal_pairs is per head
    useful = (
        attention_flops(B, H, causal_pairs(S, S), D) if dense else attention_flops(1, 1, pairs, D)
    )
    record(
        benchmark,
        flops_dense=attention_flops(B, H, causal_pairs(S, S), D),
        flops_useful=useful,
        provider=provider,
        seq=seq,
        density=density,
        listed_block_fraction=listed,
        block=BLOCK,
        config=_chosen_config(q, k) if provider == "ours" else None,
    )
    _RESULTS[(seq, density, provider)] = dict(benchmark.extra_info)
