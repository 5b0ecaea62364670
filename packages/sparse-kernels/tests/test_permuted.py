import pytest
import torch
from sparse_kernels import (
    SparsePlan,
    attention,
    grid_permutation,
    permuted_block_sparse_attention,
)
from sparse_kernels.attention import causal_mask, masked_attention_reference
from sparse_kernels.permuted import (
    MAX_MODALITIES,
    block_lists_from_mask,
    grid_line_offsets,
    inverse_permutation,
    kv_block_runs,
    pair_bit,
    permuted_block_sparse_attention_reference,
    split_run_blocks,
)
from sparse_kernels.permuted.triton import _kv_block_summaries, _launch_permuted_fwd
from sparse_kernels.testing import (
    assert_close_budget,
    default_device,
    kernel_dtypes,
    make_qkv,
    on_gpu,
)

DEV = default_device()


def _gen(seed: int) -> torch.Generator:
    return torch.Generator(device="cpu").manual_seed(seed)


def _random_perm(shape: tuple[int, ...], S: int, g: torch.Generator) -> torch.Tensor:
    return torch.argsort(torch.rand(*shape, S, generator=g), dim=-1).to(torch.int32)


def _random_blocks(lead, nqb, nkb, density, g, *, exclude=None):
    """Random block lists ``[*lead, nqb, nkb]`` (shuffled; the padding past the count is garbage
    that must never be read). ``exclude`` (bool ``[*lead, nqb, nkb]``) blocks are never picked."""
    score = torch.rand(*lead, nqb, nkb, generator=g)
    if exclude is not None:
        score = score.masked_fill(exclude, 2.0)
    order = torch.argsort(score, dim=-1)
    picked = (score < density).sum(-1)
    pad = torch.arange(nkb) >= picked[..., None]
    idx = order.masked_fill(pad, -7).to(torch.int32)
    return idx.to(DEV), picked.to(torch.int32).to(DEV)


def _perms(kind, B, H, H_KV, S_Q, S_KV, kvp, g):
    """(q_perm, kv_perm) for a perm kind; ``kvp`` = heads of kv_perm: "kv" (H_KV), "q" (H), "1"."""
    if kind == "identity":
        return None, None
    if kind == "shared":
        return _random_perm((), S_Q, g).to(DEV), _random_perm((), S_KV, g).to(DEV)
    kv_heads = {"kv": H_KV, "q": H, "1": 1}[kvp]
    if kind == "random":
        return (
            _random_perm((B, H), S_Q, g).to(DEV),
            _random_perm((B, kv_heads), S_KV, g).to(DEV),
        )
    if kind == "grid":
        # Each head its own stride and phase (strides around sqrt(S), as tokens per frame).
        def grid(S, n):
            stride = torch.randint(3, 17, (n,), generator=g)
            phase = torch.randint(0, 50, (n,), generator=g)
            return grid_permutation(S, stride.to(DEV), phase.to(DEV)).perm[None]

        return grid(S_Q, H), grid(S_KV, kv_heads)
    if kind == "modality":
        # Modality order, as for 2D-Boundary heads: segments of 20-120 tokens alternating between
        # two modalities, stably sorted by modality. Key blocks inside one segment are runs of
        # consecutive original positions; blocks across a segment end are not.
        def modality(S, n):
            out = []
            for _ in range(n):
                mod, pos, m = torch.zeros(S, dtype=torch.long), 0, 0
                while pos < S:
                    seg = int(torch.randint(20, 121, (1,), generator=g))
                    mod[pos : pos + seg] = m
                    pos, m = pos + seg, 1 - m
                out.append(torch.argsort(mod * S + torch.arange(S)))
            return torch.stack(out).to(torch.int32)[None].to(DEV)

        return modality(S_Q, 1 if kvp == "1" else H), modality(S_KV, kv_heads)
    raise ValueError(kind)


def _case(B, H, H_KV, S_Q, S_KV, D, bm, bn, perm, kvp, density, causal, full, dtype, seed=0):
    g = _gen(seed + S_Q + 7 * H)
    q, k, v = make_qkv(B, H, H_KV, S_Q, S_KV, D, dtype=dtype, device=DEV, seed=seed + S_KV)
    q_perm, kv_perm = _perms(perm, B, H, H_KV, S_Q, S_KV, kvp, g)
    nqb, nkb = -(-S_Q // bm), -(-S_KV // bn)
    # Per-(batch, head) lists when perms are per head, broadcast [1, 1, ...] lists otherwise.
    lead = (B, H) if perm in ("random", "grid", "modality") else (1, 1)
    idx, cnt = _random_blocks(lead, nqb, nkb, density, g)
    kw = dict(
        q_perm=q_perm,
        kv_perm=kv_perm,
        kv_indices=idx,
        kv_num_blocks=cnt,
        block_size=(bm, bn),
        seq_lengths=(S_Q, S_KV),
        causal=causal,
    )
    if full:
        taken = torch.zeros(*lead, nqb, nkb + 1, dtype=torch.bool)
        valid = torch.arange(idx.shape[-1], device=DEV) < cnt[..., None]
        taken.scatter_(-1, torch.where(valid, idx.long(), nkb).cpu(), True)
        fidx, fcnt = _random_blocks(lead, nqb, nkb, 0.3, g, exclude=taken[..., :nkb])
        kw.update(full_kv_indices=fidx, full_kv_num_blocks=fcnt)
    return q, k, v, kw


def _check(q, k, v, kw, dtype):
    """The kernel on ``SparsePlan(**kw)`` against the reference, within the error budget."""
    plan = SparsePlan(**kw)
    res = permuted_block_sparse_attention(q, k, v, plan, impl="triton")
    gold = permuted_block_sparse_attention_reference(q, k, v, plan, compute_dtype=torch.float64)
    low = permuted_block_sparse_attention_reference(q, k, v, plan, compute_dtype=q.dtype)
    assert res.out.shape == q.shape and res.out.dtype == q.dtype
    assert res.lse.shape == q.shape[:3] and res.lse.dtype == torch.float32
    assert_close_budget(res.out, low.out, gold.out, dtype=dtype, name="out")
    assert_close_budget(res.lse, low.lse, gold.lse, dtype=torch.float32, floor=1e-3, name="lse")
    return res


# (B, H, H_KV, S_Q, S_KV, D, block_m, block_n, perm, kv_perm heads, density, causal, full list)
CASES = [
    pytest.param(1, 2, 2, 97, 97, 64, 64, 64, "identity", "1", 0.6, True, False, id="S97-identity"),
    pytest.param(
        2,
        4,
        1,
        97,
        97,
        64,
        32,
        64,
        "random",
        "kv",
        0.7,
        True,
        False,
        id="B2-S97-gqa4-random-bm32-bn64",
    ),
    pytest.param(
        1,
        7,
        1,
        300,
        300,
        80,
        64,
        32,
        "grid",
        "q",
        0.4,
        True,
        False,
        id="S300-gqa7-D80-grid-perqhead",
    ),
    pytest.param(
        1, 4, 2, 300, 300, 64, 32, 32, "modality", "kv", 0.6, True, False, id="S300-modality-runs"
    ),
    pytest.param(
        2, 2, 1, 260, 260, 64, 32, 64, "modality", "1", 0.5, True, True, id="B2-S260-modality-full"
    ),
    pytest.param(
        1,
        4,
        4,
        300,
        300,
        96,
        128,
        64,
        "shared",
        "1",
        0.5,
        False,
        True,
        id="S300-D96-shared-bm128-noncausal-full",
    ),
    pytest.param(
        1,
        2,
        1,
        1025,
        1025,
        128,
        128,
        128,
        "grid",
        "kv",
        0.2,
        True,
        True,
        id="S1025-gqa2-D128-grid-b128-full",
    ),
    pytest.param(
        1, 4, 2, 70, 250, 64, 32, 64, "random", "q", 0.5, True, False, id="SQ70-SKV250-random"
    ),
    pytest.param(
        1, 2, 2, 150, 70, 64, 64, 32, "random", "kv", 0.8, True, False, id="SQ150-SKV70-emptyrows"
    ),
    pytest.param(
        1, 2, 1, 1, 257, 64, 16, 64, "random", "q", 0.7, True, False, id="SQ1-SKV257-decode"
    ),
]
GPU_CASES = [
    pytest.param(
        1, 28, 4, 8192, 8192, 128, 64, 64, "grid", "q", 0.1, True, False,
        id="S8192-qwen-grid", marks=pytest.mark.gpu,
    ),
    pytest.param(
        1, 28, 4, 8192, 8192, 128, 128, 128, "random", "kv", 0.1, True, True,
        id="S8192-qwen-random-b128-full", marks=pytest.mark.gpu,
    ),
    pytest.param(
        2, 8, 8, 3001, 5000, 64, 128, 64, "shared", "1", 0.3, True, False,
        id="B2-SQ3001-SKV5000-D64-shared", marks=pytest.mark.gpu,
    ),
]  # fmt: skip


@pytest.mark.parametrize("dtype", kernel_dtypes(), ids=str)
@pytest.mark.parametrize(
    "B,H,H_KV,S_Q,S_KV,D,bm,bn,perm,kvp,density,causal,full", CASES + GPU_CASES
)
def test_matches_reference(
    B, H, H_KV, S_Q, S_KV, D, bm, bn, perm, kvp, density, causal, full, dtype
):
    q, k, v, kw = _case(B, H, H_KV, S_Q, S_KV, D, bm, bn, perm, kvp, density, causal, full, dtype)
    _check(q, k, v, kw, dtype)


def _all_blocks(S_Q, S_KV, bm, bn, causal_only):
    nqb, nkb = -(-S_Q // bm), -(-S_KV // bn)
    idx = torch.arange(nkb, dtype=torch.int32).expand(1, 1, nqb, nkb).contiguous()
    if causal_only:
        # Blocks holding at least one causally visible key (identity permutations).
        last_key = (torch.arange(nqb) * bm + bm - 1).clamp_max(S_Q - 1) + (S_KV - S_Q)
        cnt = (last_key.clamp_min(-1) // bn + 1).clamp(0, nkb)
    else:
        cnt = torch.full((nqb,), nkb)
    return idx.to(DEV), cnt.to(torch.int32).expand(1, 1, nqb).contiguous().to(DEV)


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "noncausal"])
def test_identity_all_blocks_equals_dense_kernel(causal):
    # Same tiles as the dense kernel's interpreter config and the same key order: the same
    # arithmetic, so the interpreter result is bit-identical.
    from sparse_kernels.attention import triton as dense_triton

    bm, bn = dense_triton.SPEC.interpreter["BLOCK_M"], dense_triton.SPEC.interpreter["BLOCK_N"]
    S = 300
    q, k, v = make_qkv(1, 4, 2, S, S, 64, dtype=torch.float32, device=DEV, seed=5)
    idx, cnt = _all_blocks(S, S, bm, bn, causal)
    plan = SparsePlan(
        kv_indices=idx, kv_num_blocks=cnt, block_size=(bm, bn), seq_lengths=(S, S), causal=causal
    )
    res = permuted_block_sparse_attention(q, k, v, plan, impl="triton")
    dense = attention(q, k, v, causal=causal, impl="triton")
    if on_gpu():
        torch.testing.assert_close(res.out, dense.out, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(res.lse, dense.lse, atol=1e-5, rtol=1e-5)
    else:
        assert torch.equal(res.out, dense.out) and torch.equal(res.lse, dense.lse)


@pytest.mark.parametrize("perm", ["shared", "random", "grid"])
def test_all_blocks_with_any_permutation_is_dense_causal(perm):
    # Listing every block makes the permutation invisible: causal on original positions gives
    # exactly dense causal attention, whatever the order rows and columns are visited in.
    S, H, H_KV = 97, 4, 2
    q, k, v = make_qkv(1, H, H_KV, S, S, 64, dtype=torch.float32, device=DEV, seed=1)
    q_perm, kv_perm = _perms(perm, 1, H, H_KV, S, S, "kv", _gen(3))
    idx, cnt = _all_blocks(S, S, 32, 32, False)
    plan = SparsePlan(
        q_perm=q_perm, kv_perm=kv_perm, kv_indices=idx, kv_num_blocks=cnt, block_size=32,
        seq_lengths=(S, S),
    )  # fmt: skip
    res = permuted_block_sparse_attention(q, k, v, plan, impl="triton")
    gold = attention(q, k, v, impl="reference")
    torch.testing.assert_close(res.out, gold.out, atol=2e-5, rtol=0)
    torch.testing.assert_close(res.lse, gold.lse, atol=2e-5, rtol=0)


def test_causal_is_on_original_positions_not_permuted_ones():
    S, bm = 128, 32
    q, k, v = make_qkv(1, 2, 2, S, S, 64, dtype=torch.float32, device=DEV, seed=2)
    perm = grid_permutation(S, 4, 1, device=DEV).perm  # [1, S]
    nb = S // bm
    # With stride 4 and S = 128 every grid line is one block; query line m lists lines m and m - 1.
    m = torch.arange(nb, device=DEV)
    idx = torch.stack([m, (m - 1).clamp_min(0)], -1).to(torch.int32).view(1, 1, nb, 2)
    cnt = torch.where(m > 0, 2, 1).to(torch.int32).view(1, 1, nb)
    plan = SparsePlan(
        q_perm=perm, kv_perm=perm, kv_indices=idx, kv_num_blocks=cnt, block_size=bm,
        seq_lengths=(S, S),
    )  # fmt: skip
    res = permuted_block_sparse_attention(q, k, v, plan, impl="triton")
    # Independent construction in original coordinates: key line == query line or the one
    # before it (line of token t is (t - 1) mod 4), and j <= i.
    i = torch.arange(S, device=DEV)
    line = (i - 1) % 4
    d = line[:, None] - line[None, :]
    planted = ((d == 0) | (d == 1)) & causal_mask(S, S, DEV)
    assert torch.equal(plan.to_dense(heads=2)[0, 0], planted)
    want = masked_attention_reference(q, k, v, planted, scale=64**-0.5, compute_dtype=torch.float64)
    torch.testing.assert_close(res.out, want.out, atol=2e-5, rtol=0)
    # A naive kernel applying causality to PERMUTED indices (c <= r) attends another set: e.g.
    # original query 1 (line 0) would see every key of line 3, including 4 > 1.
    listed = torch.zeros(nb, nb, dtype=torch.bool, device=DEV)
    listed[m, m] = True
    listed[m[1:], m[1:] - 1] = True
    naive_p = listed.repeat_interleave(bm, 0).repeat_interleave(bm, 1) & (i[None, :] <= i[:, None])
    inv = inverse_permutation(perm[0]).long()
    naive = naive_p[inv][:, inv]
    assert not torch.equal(naive, planted)
    other = masked_attention_reference(q, k, v, naive, scale=64**-0.5, compute_dtype=torch.float64)
    assert (res.out - other.out).abs().max() > 1e-2


@pytest.mark.parametrize("S,stride,phase", [(256, 4, 0), (384, 6, 5), (200, 8, 3)])
def test_grid_permutation_turns_planted_grid_into_dense_blocks(S, stride, phase):
    # Planted Grid head: a query attends the keys of its own grid line. After the grid
    # permutation the lines are contiguous; listing the (query block, key block) pairs that
    # share a line reproduces the planted pattern wherever lines are block-aligned, and the
    # kernel equals the reference of exactly that set.
    H = 2
    bm = 16
    q, k, v = make_qkv(1, H, 1, S, S, 64, dtype=torch.float16, device=DEV, seed=S)
    p = grid_permutation(S, stride, phase, device=DEV)
    offs = grid_line_offsets(S, stride, phase, device=DEV)[0]
    line_of = torch.searchsorted(offs, torch.arange(S, device=DEV), right=True) - 1  # permuted pos
    nb = -(-S // bm)
    blk_lines = torch.zeros(nb, stride, dtype=torch.bool, device=DEV)
    blk_lines[torch.arange(S, device=DEV) // bm, line_of] = True
    share = (blk_lines.float() @ blk_lines.float().T) > 0  # [nb, nb]
    cnt = share.sum(-1).to(torch.int32)
    idx = torch.argsort((~share).to(torch.int8), dim=-1, stable=True).to(torch.int32)
    kw = dict(
        q_perm=p.perm, kv_perm=p.perm, kv_indices=idx[None, None], kv_num_blocks=cnt[None, None],
        block_size=bm, seq_lengths=(S, S),
    )  # fmt: skip
    mask = SparsePlan(**kw).to_dense(heads=H)[0, 0]
    i = torch.arange(S, device=DEV)
    planted = ((i[:, None] - i[None, :]) % stride == 0) & causal_mask(S, S, DEV)
    assert bool((mask | ~planted).all()), "the permuted block lists must cover the planted grid"
    if (offs[1 : stride + 1] % bm == 0).all():
        assert torch.equal(mask, planted)
    _check(q, k, v, kw, torch.float16)


def test_grid_permutation_matches_python_definition():
    S = 53
    stride = torch.tensor([1, 4, 7, 53, 60])
    phase = torch.tensor([0, 2, 12, -3, 59])
    p = grid_permutation(S, stride, phase)
    offs = grid_line_offsets(S, stride, phase)
    assert p.perm.dtype == torch.int32 and p.perm.shape == (5, S)
    for h in range(5):
        s_, ph = int(stride[h]), int(phase[h])
        want = sorted(range(S), key=lambda i: ((i - ph) % s_, i))
        assert torch.equal(p.perm[h], torch.tensor(want, dtype=torch.int32))
        assert torch.equal(p.inverse[h][p.perm[h].long()], torch.arange(S, dtype=torch.int32))
        counts = [sum(1 for i in range(S) if (i - ph) % s_ == c) for c in range(60)]
        want_offs = torch.tensor([0] + counts).cumsum(0)
        assert torch.equal(offs[h], want_offs)
    # The caller's offsets give the same permutation.
    assert torch.equal(grid_permutation(S, stride, phase, offsets=offs).perm, p.perm)
    # A caller's bound on the strides (no read-back): the same table, padded with S.
    wide = grid_line_offsets(S, stride, phase, max_stride=64)
    assert wide.shape == (5, 65)
    assert torch.equal(wide[:, :61], offs) and bool((wide[:, 61:] == S).all())
    assert torch.equal(grid_permutation(S, stride, phase, offsets=wide).perm, p.perm)


@pytest.mark.parametrize("S", [1, 7, 53, 256, 1000, 3001], ids=lambda s: f"S{s}")
def test_grid_permutation_triton_equals_reference(S):
    """The one-pass kernel (arithmetic line starts, binary search) against the torch path, with
    strides below, at and above S, phases of any sign, and the bound from an offsets table."""
    stride = torch.tensor([1, 2, 4, 7, 53, 60, 256, 257, 4096])
    phase = torch.tensor([0, -1, 2, 12, -3, 59, 37, 1000, -5000])
    ref = grid_permutation(S, stride, phase, impl="reference")
    got = grid_permutation(S, stride.to(DEV), phase.to(DEV), impl="triton")
    assert torch.equal(got.perm.cpu(), ref.perm) and torch.equal(got.inverse.cpu(), ref.inverse)
    offs = grid_line_offsets(S, stride, phase, max_stride=5000).to(DEV)
    wide = grid_permutation(S, stride.to(DEV), phase.to(DEV), offsets=offs, impl="triton")
    assert torch.equal(wide.perm.cpu(), ref.perm)
    one = grid_permutation(S, 6, 4, device=DEV, impl="triton")
    assert torch.equal(one.perm.cpu(), grid_permutation(S, 6, 4, impl="reference").perm)
    with pytest.raises(ValueError, match="stride: expected every value >= 1"):
        grid_permutation(S, 0, device=DEV, impl="triton")
    with pytest.raises(NotImplementedError, match="int32"):
        grid_permutation(S, 2**30, device=DEV, impl="triton")


@pytest.mark.parametrize("max_blocks", [None, 9], ids=["tight", "padded"])
def test_block_lists_from_mask_round_trip(max_blocks):
    from sparse_kernels.permuted.reference import block_list_mask

    mask = torch.rand(2, 3, 5, 7, generator=_gen(0)) < 0.4
    mask[0, 0, 0] = False  # an empty row
    idx, cnt = block_lists_from_mask(mask, max_blocks=max_blocks)
    assert idx.dtype == torch.int32 and cnt.dtype == torch.int32
    assert idx.shape[-1] == (int(mask.sum(-1).max()) if max_blocks is None else max_blocks)
    assert torch.equal(cnt, mask.sum(-1).to(torch.int32))
    assert bool(((idx >= 0) & (idx < 7)).all())
    assert torch.equal(block_list_mask(idx, cnt, 7), mask)
    with pytest.raises(ValueError, match="max_blocks"):
        block_lists_from_mask(torch.ones(1, 4, dtype=torch.bool), max_blocks=3)
    with pytest.raises(TypeError, match="bool"):
        block_lists_from_mask(mask.int())


@pytest.mark.parametrize("width", [1, 33, 127, 128, 300], ids=lambda w: f"W{w}")
def test_compact_by_mask_matches_a_stable_sort(width):
    """Narrow rows take the transposed-scan path, wide rows the innermost scan: both must give
    what a stable sort of ``~mask`` gathers."""
    from sparse_kernels.permuted.perms import compact_by_mask

    mask = torch.rand(3, 7, width, generator=_gen(width)) < 0.3
    mask[1, 2] = False  # an empty row
    values = torch.randint(0, 1000, (3, 7, width), generator=_gen(1), dtype=torch.int32)
    out, cnt = compact_by_mask(mask.to(DEV), values.to(DEV))
    order = torch.sort((~mask).to(torch.int8), dim=-1, stable=True).indices
    want = torch.where(
        torch.arange(width) < mask.sum(-1, keepdim=True), values.gather(-1, order), 0
    )
    wmax = max(1, int(mask.sum(-1).max()))
    assert torch.equal(cnt.cpu(), mask.sum(-1).to(torch.int32))
    assert torch.equal(out.cpu(), want[..., :wmax])


@pytest.mark.parametrize(
    ("B_perm", "B_mod", "heads", "S", "blk"), [(1, 2, 3, 100, 32), (2, 1, 1, 64, 16)]
)
def test_kv_block_summaries_match_their_definition(B_perm, B_mod, heads, S, blk):
    # The kernel's mask-needed test reads these; compared exactly with a loop over the blocks.
    g = _gen(21)
    perm = _random_perm((B_perm, heads), S, g)
    mod = torch.randint(0, MAX_MODALITIES, (B_mod, S), generator=g)
    mod[:, : S // 2] = 3  # blocks with a single modality too
    kv_max, kv_set = _kv_block_summaries(perm, mod, blk, S, causal=True)
    B_ = max(B_perm, B_mod)
    nkb = -(-S // blk)
    assert kv_max.shape == kv_set.shape == (B_, heads, nkb)
    for b in range(B_):
        for h in range(heads):
            for n in range(nkb):
                cols = perm[b % B_perm, h, n * blk : (n + 1) * blk].long()
                assert kv_max[b, h, n] == cols.max()
                want = sum(1 << m for m in set(mod[b % B_mod, cols].tolist()))
                assert kv_set[b, h, n] == want
    # Without a permutation: blocks of the original order; without causality: no max.
    kv_max, kv_set = _kv_block_summaries(None, mod, blk, S, causal=True)
    assert kv_max is None and kv_set.shape == (B_mod, 1, nkb)
    want = [sum(1 << m for m in set(mod[0, n * blk : (n + 1) * blk].tolist())) for n in range(nkb)]
    assert kv_set[0, 0].tolist() == want
    assert _kv_block_summaries(perm, None, blk, S, causal=False) == (None, None)


def _runs_by_loop(perm: torch.Tensor, blk: int, step: int = 1) -> list[int]:
    S, out = perm.shape[-1], []
    for n in range(-(-S // blk)):
        cols = perm[n * blk : (n + 1) * blk].long().cpu()
        steady = torch.equal(cols, cols[0] + step * torch.arange(len(cols)))
        whole = len(cols) == blk or int(cols[-1]) + step >= S
        out.append(int(cols[0]) if steady and whole else -1)
    return out


def test_kv_block_runs_match_their_definition():
    # A block whose keys are consecutive original positions gives its first one, others -1.
    S, blk = 200, 32
    _, kv_perm = _perms("modality", 1, 2, 2, S, S, "kv", _gen(5))
    runs = kv_block_runs(kv_perm, blk)
    assert runs.shape == (1, 2, -(-S // blk)) and runs.dtype == torch.int32
    for h in range(2):
        assert runs[0, h].tolist() == _runs_by_loop(kv_perm[0, h], blk)
    assert (runs >= 0).any() and (runs < 0).any()  # the case has both kinds
    # Identity: every block is a run, the partial last one too (it ends at S - 1).
    ident = torch.arange(S, device=DEV)
    assert kv_block_runs(ident, blk).tolist() == list(range(0, S, blk))
    # A partial last block that is consecutive but does not end at S - 1 is not a run.
    p = torch.cat([torch.arange(8, S, device=DEV), torch.arange(8, device=DEV)])
    assert kv_block_runs(p, blk).tolist() == _runs_by_loop(p, blk)
    assert kv_block_runs(p, blk)[-1] == -1
    # Grid orders: the blocks inside one grid line are runs with step = stride (per head).
    strides = torch.tensor([5, 7], device=DEV)
    gp = grid_permutation(S, strides, torch.tensor([1, 3], device=DEV)).perm
    runs = kv_block_runs(gp, 8, strides)
    for h, st in enumerate(strides.tolist()):
        assert runs[h].tolist() == _runs_by_loop(gp[h], 8, st)
    assert (runs >= 0).any() and (runs < 0).any()


@pytest.mark.parametrize("perm", ["modality", "grid", "identity-perm"])
@pytest.mark.parametrize("full", [False, True], ids=["partial", "with-full"])
def test_split_run_blocks_attends_the_same(perm, full):
    # The split lists attend exactly the pairs of the original lists (masks compared exactly),
    # and the kernel on the split lists matches the reference within the budget.
    B, H, H_KV, S, D, blk = 1, 4, 2, 230, 64, 32
    kind = "modality" if perm == "identity-perm" else perm
    q, k, v, kw = _case(B, H, H_KV, S, S, D, blk, blk, kind, "q", 0.6, True, full, torch.float32)
    if perm == "identity-perm":
        kw["q_perm"] = None
        kw["kv_perm"] = torch.arange(S, dtype=torch.int32, device=DEV).expand(1, H, S).contiguous()
    kv_perm = kw["kv_perm"]
    # Grid perms of this helper: per-head strides 3..16 (the gap between a line's first tokens).
    # The kernel's three run paths: a per-head step read at run time (grid), a step-1 tensor
    # (the same branch, taking its constant-step loop: modality), the int 1 (compiled in).
    step = {
        "grid": (kv_perm[..., 1] - kv_perm[..., 0]).long(),
        "modality": torch.ones(1, H, dtype=torch.long, device=DEV),
        "identity-perm": 1,
    }[perm]
    idx, cnt, rs, rc = split_run_blocks(
        kv_perm, kw["kv_indices"], kw["kv_num_blocks"], blk, step=step
    )
    split = dict(kw, kv_indices=idx, kv_num_blocks=cnt, kv_run_starts=rs, kv_run_counts=rc)
    split["kv_run_step"] = step
    # With a width given, the one-kernel split equals the torch one entry for entry.
    runs = kv_block_runs(kv_perm, blk, step)
    W = kw["kv_indices"].shape[-1]
    for width in (W, W + 3):
        args = (kv_perm, kw["kv_indices"], kw["kv_num_blocks"], blk)
        ref = split_run_blocks(*args, runs=runs, width=width, impl="reference")
        got = split_run_blocks(*args, runs=runs, width=width, impl="triton")
        assert all(torch.equal(a, b) for a, b in zip(got, ref)), width
    with pytest.raises(NotImplementedError, match="needs an output width"):
        split_run_blocks(*args, runs=runs, impl="triton")
    assert int(cnt.sum() + rc.sum()) == int(kw["kv_num_blocks"].sum())
    assert int(rc.sum()) > 0
    if perm == "identity-perm":
        assert int(cnt.sum()) == 0
    for causal in (True, False):
        want = SparsePlan(**dict(kw, causal=causal)).to_dense(heads=H)
        got = SparsePlan(**dict(split, causal=causal)).to_dense(heads=H)
        assert torch.equal(got, want)
    _check(q, k, v, split, torch.float32)


def test_per_head_permutations_in_one_launch_match_per_head_calls():
    # One launch with a different grid per head == each head run alone with its own grid.
    S, H = 150, 3
    q, k, v = make_qkv(1, H, H, S, S, 64, dtype=torch.float32, device=DEV, seed=9)
    p = grid_permutation(
        S, torch.tensor([5, 9, 12], device=DEV), torch.tensor([0, 4, 11], device=DEV)
    )
    idx, cnt = _random_blocks((1, H), 5, 5, 0.6, _gen(4))
    kw = dict(block_size=32, seq_lengths=(S, S))
    plan = SparsePlan(
        q_perm=p.perm[None], kv_perm=p.perm[None], kv_indices=idx, kv_num_blocks=cnt, **kw
    )
    res = permuted_block_sparse_attention(q, k, v, plan, impl="triton")
    for h in range(H):
        sl = slice(h, h + 1)
        head = SparsePlan(
            q_perm=p.perm[h], kv_perm=p.perm[h], kv_indices=idx[:, sl], kv_num_blocks=cnt[:, sl],
            **kw,
        )  # fmt: skip
        one = permuted_block_sparse_attention(q[:, sl], k[:, sl], v[:, sl], head, impl="triton")
        assert torch.equal(res.out[:, sl], one.out) and torch.equal(res.lse[:, sl], one.lse)


def test_empty_rows_are_zero_with_neginf_lse():
    S, bm = 97, 32
    q, k, v = make_qkv(1, 2, 1, S, S, 64, dtype=torch.float32, device=DEV, seed=4)
    perm = _random_perm((), S, _gen(0)).to(DEV)
    idx = torch.zeros(1, 1, 4, 1, dtype=torch.int32, device=DEV)
    cnt = torch.tensor([[[1, 0, 1, 0]]], dtype=torch.int32, device=DEV)
    plan = SparsePlan(
        q_perm=perm, kv_indices=idx, kv_num_blocks=cnt, block_size=bm, seq_lengths=(S, S),
        causal=False,
    )  # fmt: skip
    res = permuted_block_sparse_attention(q, k, v, plan, impl="triton")
    empty_rows = perm[torch.cat([torch.arange(32, 64), torch.arange(96, 97)]).to(DEV)].long()
    assert torch.equal(res.out[:, :, empty_rows], torch.zeros_like(res.out[:, :, empty_rows]))
    assert bool(torch.isneginf(res.lse[:, :, empty_rows]).all())
    full_rows = torch.ones(S, dtype=torch.bool, device=DEV)
    full_rows[empty_rows] = False
    assert bool(torch.isfinite(res.lse[:, :, full_rows]).all())


def test_full_blocks_skip_the_causal_mask():
    # A full block above the diagonal is attended in full (the caller's promise), a partial one
    # only where causally visible.
    S, bm = 64, 32
    q, k, v = make_qkv(1, 1, 1, S, S, 64, dtype=torch.float32, device=DEV, seed=6)
    idx = torch.tensor([[[[0], [0]]]], dtype=torch.int32, device=DEV)
    cnt = torch.ones(1, 1, 2, dtype=torch.int32, device=DEV)
    fidx = torch.tensor([[[[1], [1]]]], dtype=torch.int32, device=DEV)
    plan = SparsePlan(
        kv_indices=idx, kv_num_blocks=cnt, full_kv_indices=fidx, full_kv_num_blocks=cnt,
        block_size=bm, seq_lengths=(S, S),
    )  # fmt: skip
    res = permuted_block_sparse_attention(q, k, v, plan, impl="triton")
    i = torch.arange(S, device=DEV)
    mask = ((i[None, :] < 32) & (i[None, :] <= i[:, None])) | (i[None, :] >= 32)
    want = masked_attention_reference(q, k, v, mask, scale=64**-0.5, compute_dtype=torch.float64)
    torch.testing.assert_close(res.out, want.out, atol=2e-5, rtol=0)


def test_noncontiguous_bshd_inputs():
    q, k, v = make_qkv(1, 4, 2, 97, 97, 64, dtype=torch.float16, device=DEV, seed=8, layout="bshd")
    q_perm, kv_perm = _perms("random", 1, 4, 2, 97, 97, "kv", _gen(8))
    idx, cnt = _random_blocks((1, 4), 2, 2, 0.7, _gen(9))
    kw = dict(
        q_perm=q_perm, kv_perm=kv_perm, kv_indices=idx, kv_num_blocks=cnt, block_size=64,
        seq_lengths=(97, 97),
    )  # fmt: skip
    _check(q, k, v, kw, torch.float16)


def _modality_case(S, H, H_KV, n_mod, dtype, seed):
    """Random modality per token (in runs, like interleaved text / frames), Q and K/V permuted to
    modality order, every causally useful block listed with random allowed pairs per entry."""
    g = _gen(seed)
    runs = torch.randint(1, 40, (S,), generator=g).cumsum(0)
    run_of = torch.searchsorted(runs, torch.arange(S), right=True)
    mod = (torch.randint(0, n_mod, (int(run_of.max()) + 1,), generator=g)[run_of]).to(DEV)
    perm = torch.argsort(mod * S + torch.arange(S, device=DEV)).to(torch.int32)
    q, k, v = make_qkv(1, H, H_KV, S, S, 64, dtype=dtype, device=DEV, seed=seed)
    nb = -(-S // 32)
    idx = torch.argsort(torch.rand(1, H, nb, nb, generator=g), -1).to(torch.int32).to(DEV)
    cnt = torch.randint(nb // 2, nb + 1, (1, H, nb), generator=g).to(torch.int32).to(DEV)
    bits = torch.randint(0, 2, (1, H, nb, nb, n_mod, n_mod), generator=g)
    weights = torch.tensor(
        [[pair_bit(a, b) for b in range(n_mod)] for a in range(n_mod)], dtype=torch.int64
    )
    pairs = (bits * weights).sum((-1, -2)).to(DEV)
    kw = dict(
        q_perm=perm, kv_perm=perm, kv_indices=idx, kv_num_blocks=cnt, block_size=32,
        seq_lengths=(S, S), q_modality=mod, kv_modality=mod, kv_block_pairs=pairs,
    )  # fmt: skip
    return q, k, v, kw


@pytest.mark.parametrize("dtype", kernel_dtypes(), ids=str)
def test_per_pair_modality_masks_match_reference(dtype):
    q, k, v, kw = _modality_case(200, 4, 2, 3, dtype, seed=21)
    _check(q, k, v, kw, dtype)


@pytest.mark.gpu
def test_per_pair_modality_masks_bf16_gpu():
    # Block 32 matches no GPU candidate tile: this also runs the fallback config.
    q, k, v, kw = _modality_case(4099, 8, 2, 4, torch.bfloat16, seed=22)
    _check(q, k, v, kw, torch.bfloat16)


def test_intra_modality_pairs_equal_independent_mask():
    # 2D-Boundary with only same-modality pairs allowed, every block listed: exactly
    # "same modality and causal", although blocks straddle modality boundaries in permuted order.
    q, k, v, kw = _modality_case(150, 2, 1, 3, torch.float32, seed=5)
    nb = kw["kv_indices"].shape[-1]
    kw["kv_num_blocks"] = torch.full_like(kw["kv_num_blocks"], nb)
    same = sum(pair_bit(a, a) for a in range(3))
    kw["kv_block_pairs"] = torch.full_like(kw["kv_block_pairs"], same)
    res = permuted_block_sparse_attention(q, k, v, SparsePlan(**kw), impl="triton")
    mod = kw["q_modality"]
    mask = (mod[:, None] == mod[None, :]) & causal_mask(150, 150, DEV)
    want = masked_attention_reference(q, k, v, mask, scale=64**-0.5, compute_dtype=torch.float64)
    torch.testing.assert_close(res.out, want.out, atol=2e-5, rtol=0)
    torch.testing.assert_close(res.lse, want.lse.float(), atol=2e-5, rtol=0)


def test_all_pairs_allowed_equals_no_pair_mask():
    # Every bit set (int64 -1, bit 63 = pair (7, 7) included) must change nothing.
    q, k, v, kw = _modality_case(97, 2, 2, MAX_MODALITIES, torch.float32, seed=3)
    kw["kv_block_pairs"] = torch.full_like(kw["kv_block_pairs"], -1)
    with_pairs = permuted_block_sparse_attention(q, k, v, SparsePlan(**kw), impl="triton")
    for name in ("q_modality", "kv_modality", "kv_block_pairs"):
        kw.pop(name)
    without = permuted_block_sparse_attention(q, k, v, SparsePlan(**kw), impl="triton")
    assert torch.equal(with_pairs.out, without.out) and torch.equal(with_pairs.lse, without.lse)


@pytest.mark.parametrize(
    "block_size,D,match",
    [
        pytest.param((48, 64), 64, "block_m", id="block48"),
        pytest.param((64, 512), 64, "block_n", id="block512"),
        pytest.param((64, 64), 160, "head dims", id="D160"),
    ],
)
def test_triton_unsupported_cases_raise(block_size, D, match):
    q, k, v = make_qkv(1, 2, 1, 100, 100, D, dtype=torch.float32, device=DEV)
    nqb = -(-100 // block_size[0])
    plan = SparsePlan(
        kv_indices=torch.zeros(1, 1, nqb, 1, dtype=torch.int32, device=DEV),
        kv_num_blocks=torch.ones(1, 1, nqb, dtype=torch.int32, device=DEV),
        block_size=block_size, seq_lengths=(100, 100),
    )  # fmt: skip
    with pytest.raises(NotImplementedError, match=match):
        permuted_block_sparse_attention(q, k, v, plan, impl="triton")


def test_reference_row_chunking_is_exact():
    q, k, v, kw = _case(
        1, 4, 2, 300, 300, 32, 32, 64, "random", "kv", 0.5, True, True, torch.float64
    )
    plan = SparsePlan(**kw)
    a = permuted_block_sparse_attention_reference(q, k, v, plan, row_chunk=64)
    b = permuted_block_sparse_attention_reference(q, k, v, plan, row_chunk=1000)
    torch.testing.assert_close(a.out, b.out, atol=1e-12, rtol=0)
    torch.testing.assert_close(a.lse, b.lse, atol=1e-12, rtol=0)


def test_reference_accepts_any_block_size_and_head_dim():
    q, k, v = make_qkv(1, 2, 1, 50, 50, 24, dtype=torch.float32, device=DEV)
    perm = _random_perm((), 50, _gen(1)).to(DEV)
    idx, cnt = _all_blocks(50, 50, 7, 11, False)
    plan = SparsePlan(
        q_perm=perm, kv_perm=perm, kv_indices=idx, kv_num_blocks=cnt, block_size=(7, 11),
        seq_lengths=(50, 50),
    )  # fmt: skip
    res = permuted_block_sparse_attention(q, k, v, plan, impl="reference")
    want = attention(q, k, v, impl="reference")
    torch.testing.assert_close(res.out, want.out, atol=1e-6, rtol=0)
    torch.testing.assert_close(res.lse, want.lse, atol=1e-6, rtol=0)


@pytest.mark.gpu
def test_every_candidate_config_is_correct():
    # A tuned table may name any candidate that fits the blocks: each one must compute the same
    # function.
    from sparse_kernels.permuted import triton as pt

    for bm, bn in [(64, 64), (128, 128), (128, 64), (64, 128)]:
        q, k, v, kw = _case(
            1,
            8,
            2,
            3000,
            3000,
            128,
            bm,
            bn,
            "grid",
            "q",
            0.2,
            True,
            True,
            torch.bfloat16,
            seed=bm + bn,
        )
        plan = SparsePlan(**kw)
        gold = permuted_block_sparse_attention_reference(q, k, v, plan, compute_dtype=torch.float64)
        low = permuted_block_sparse_attention_reference(q, k, v, plan, compute_dtype=q.dtype)
        for cfg in pt.SPEC.fitting((bm, bn)):
            out, lse = _launch_permuted_fwd(q, k, v, plan, scale=128**-0.5, config=cfg)
            assert_close_budget(out, low.out, gold.out, dtype=torch.bfloat16, name=str(cfg))
            assert_close_budget(lse, low.lse, gold.lse, dtype=torch.float32, floor=1e-3, name="lse")


def _flex_lists(H, nqb, nkb, density, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    order = torch.argsort(torch.rand(1, H, nqb, nkb, device="cuda", generator=g), dim=-1)
    cnt = torch.randint(0, int(density * nkb) + 1, (1, H, nqb), device="cuda", generator=g)
    return order.to(torch.int32), cnt.to(torch.int32)


@pytest.mark.gpu
def test_identity_perms_match_flex_attention_block_mask():
    # Identity permutations = block-sparse attention with FlexAttention's BlockMask semantics
    # (partial blocks masked by mask_mod = causal, full blocks unmasked).
    from sparse_kernels.testing import flex_attention_compiled
    from torch.nn.attention.flex_attention import BlockMask

    S, H, H_KV, bm, bn = 4096, 8, 2, 128, 128
    q, k, v = make_qkv(1, H, H_KV, S, S, 128, dtype=torch.bfloat16, device="cuda", seed=11)
    nqb, nkb = S // bm, S // bn
    idx, cnt = _flex_lists(H, nqb, nkb, 0.3, 1)
    listed = torch.zeros(1, H, nqb, nkb + 1, dtype=torch.bool, device="cuda")
    valid = torch.arange(nkb, device="cuda") < cnt[..., None]
    listed.scatter_(-1, torch.where(valid, idx.long(), nkb), True)
    # Full blocks: FlexAttention applies no mask_mod to them at all, so (as create_block_mask
    # would) only blocks wholly below the diagonal are full, and none is also partial.
    below = torch.arange(nkb, device="cuda")[None, :] < torch.arange(nqb, device="cuda")[:, None]
    g = torch.Generator(device="cuda").manual_seed(2)
    full = (torch.rand(1, H, nqb, nkb, device="cuda", generator=g) < 0.2) & below
    full &= ~listed[..., :nkb]
    fcnt = full.sum(-1).to(torch.int32)
    fidx = torch.argsort((~full).to(torch.int8), dim=-1, stable=True).to(torch.int32).contiguous()
    block_mask = BlockMask.from_kv_blocks(
        cnt, idx, fcnt, fidx, BLOCK_SIZE=(bm, bn), mask_mod=lambda b, h, i, j: j <= i
    )
    # Eager flex_attention evaluates mask_mod everywhere and ignores the block lists: only the
    # compiled kernel has BlockMask semantics (listed blocks, full blocks unmasked).
    ref = flex_attention_compiled(q, k, v, block_mask)
    ours = permuted_block_sparse_attention(q, k, v, SparsePlan.from_block_mask(block_mask))
    rows = ~torch.isneginf(ours.lse)  # flex leaves rows with no key at 0 as well
    err = (ours.out.float() - ref.float()).norm() / ref.float().norm()
    assert err < 1e-2, err
    assert torch.equal(ours.out[~rows], torch.zeros_like(ours.out[~rows]))


@pytest.mark.gpu
def test_grid_perms_match_flex_attention_mask_mod():
    # Independent check of the whole semantics: FlexAttention evaluates, for every original
    # (i, j), "the permuted block of (i, j) is listed and j <= i" through the inverse permutations.
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    S, H, H_KV, bm, bn = 4096, 8, 2, 64, 128
    q, k, v = make_qkv(1, H, H_KV, S, S, 128, dtype=torch.bfloat16, device="cuda", seed=12)
    strides = torch.tensor([64, 100, 128, 200, 256, 324, 512, 77], device="cuda")
    p = grid_permutation(S, strides, strides // 3)
    idx, cnt = _flex_lists(H, S // bm, S // bn, 0.2, 2)
    listed = torch.zeros(1, H, S // bm, S // bn + 1, dtype=torch.bool, device="cuda")
    valid = torch.arange(S // bn, device="cuda") < cnt[..., None]
    listed.scatter_(-1, torch.where(valid, idx.long(), S // bn), True)
    inv = p.inverse.long()

    def mask_mod(b, h, i, j):
        return listed[0, h, inv[h, i] // bm, inv[h, j] // bn] & (j <= i)

    block_mask = create_block_mask(mask_mod, 1, H, S, S, device="cuda")
    ref = flex_attention(q, k, v, block_mask=block_mask, enable_gqa=True)
    plan = SparsePlan(
        q_perm=p.perm, kv_perm=p.perm, q_perm_inv=p.inverse, kv_perm_inv=p.inverse, kv_indices=idx,
        kv_num_blocks=cnt, block_size=(bm, bn), seq_lengths=(S, S),
    )  # fmt: skip
    ours = permuted_block_sparse_attention(q, k, v, plan)
    err = (ours.out.float() - ref.float()).norm() / ref.float().norm()
    assert err < 1e-2, err


@pytest.mark.parametrize("q_block,kv_block", [(64, 64), (128, 64), (64, 128), (32, 256), (16, 16)])
def test_launch_configs_have_tiles_dividing_the_blocks(q_block, kv_block):
    from sparse_kernels.permuted import triton as pt

    blocks = (q_block, kv_block)
    fitting = pt.SPEC.fitting(blocks)
    for c in [*fitting, pt.SPEC.safe(blocks)]:
        assert q_block % c["BLOCK_M"] == 0 and kv_block % c["BLOCK_N"] == 0, c
    if blocks == (128, 64):
        assert {(c["BLOCK_M"], c["BLOCK_N"]) for c in fitting} == {(128, 64), (64, 64)}
    if min(blocks) < 64:
        # No candidate fits: the fallback cuts the 64-key tile to the blocks.
        assert not fitting
        assert pt.SPEC.safe(blocks)["BLOCK_M"] == min(q_block, 64)
    # The interpreter and fp32 configs, cut to the blocks as the launcher does.
    for c, most in ((pt.SPEC.interpreter, (64, 64)), (pt.SPEC.fp32, (64, 32))):
        cut = pt._tiles_within_blocks(c, blocks)
        assert (cut["BLOCK_M"], cut["BLOCK_N"]) == (min(q_block, most[0]), min(kv_block, most[1]))
        assert pt._tiles_divide_blocks(cut, blocks)


def test_safe_config_is_the_smallest_dividing_candidate():
    from sparse_kernels.permuted import triton as pt

    safe = pt.SPEC.safe((128, 64))
    assert (safe["BLOCK_M"], safe["BLOCK_N"], safe.num_stages) == (64, 64, 2)


def test_launch_config_tiles_must_divide_the_blocks():
    from sparse_kernels.tuning import LaunchConfig

    q, k, v = make_qkv(1, 2, 1, 128, 128, 64, dtype=torch.float16, device="meta", seed=0)
    idx = torch.zeros(1, 1, 2, 1, dtype=torch.int32, device="meta")
    cnt = torch.ones(1, 1, 2, dtype=torch.int32, device="meta")
    cfg = LaunchConfig.of(BLOCK_M=128, BLOCK_N=64, num_warps=4, num_stages=3)
    plan = SparsePlan(
        kv_indices=idx, kv_num_blocks=cnt, block_size=64, seq_lengths=(128, 128),
        check_contents=False,
    )  # fmt: skip
    with pytest.raises(ValueError, match=r"tiles must divide the block sizes \(64, 64\), got"):
        _launch_permuted_fwd(q, k, v, plan, scale=0.125, config=cfg)


def test_grid_offsets_and_permutation_check_strides_without_reading_them():
    from sparse_kernels.permuted import grid_line_offsets, grid_permutation

    st = torch.tensor([3, 8])
    with pytest.raises(ValueError, match="max_stride: expected an int >= 1, got 0"):
        grid_line_offsets(100, st, 0, max_stride=0)
    with pytest.raises(RuntimeError, match="at most max_stride=4"):
        grid_line_offsets(100, st, 0, max_stride=4)
    offs = grid_line_offsets(100, st, 0, max_stride=16)
    with pytest.raises(RuntimeError, match="stride: expected every value >= 1"):
        grid_permutation(100, torch.tensor([0, 8]), 0, offsets=offs)
    with pytest.raises(ValueError, match=r"offsets: expected an int tensor \[2, W \+ 1\]"):
        grid_permutation(100, st, 0, offsets=offs[0])


def _grid_blocks_reference(S, stride, phase, vline, slash, blk):
    """What ``grid_blocks_triton`` computes, from the reference permutation and line table."""
    from sparse_kernels.permuted import kv_block_runs
    from sparse_kernels.permuted.perms import grid_line_offsets

    perm = grid_permutation(S, stride, phase, impl="reference").perm
    offs = grid_line_offsets(S, stride, phase)
    N, nb = stride.shape[0], -(-S // blk)
    pad = torch.nn.functional.pad(perm.long(), (0, nb * blk - S), value=-1).reshape(N, nb, blk)
    kmin = torch.where(pad < 0, S, pad).amin(-1)
    qmax = pad.amax(-1)
    first = torch.arange(nb) * blk
    last = torch.clamp(first + blk, max=S) - 1
    c_lo = torch.searchsorted(offs, first.expand(N, -1).contiguous(), right=True) - 1
    c_hi = torch.searchsorted(offs, last.expand(N, -1).contiguous(), right=True) - 1
    s_lo = offs.gather(1, c_lo) // blk
    s_hi = torch.where(slash[:, None], (offs.gather(1, c_hi + 1) - 1) // blk, s_lo - 1)
    runs = kv_block_runs(perm, blk, stride)
    v_hi = torch.where(vline, (offs[:, 1] - 1) // blk, -1)
    widths = [int(v_hi.max()) + 1, max(0, int((s_hi - s_lo + 1).max()))]
    blocks = torch.stack([kmin, qmax, s_lo, s_hi, runs.long()]).to(torch.int32)
    return perm, blocks, v_hi.to(torch.int32), widths


@pytest.mark.parametrize(
    "S, strides, phases, blk",
    [
        pytest.param(1025, [16, 8, 2, 4], [5, 3, 1, 0], 64, id="S1025-blk64"),
        pytest.param(1000, [24, 12, 7, 1], [23, 40, 3, 0], 32, id="phase-past-stride-stride1"),
        pytest.param(777, [7, 7, 256], [2, 6, 100], 48, id="blk48-stride-past-blk"),
        pytest.param(300, [3, 5], [1, 4], 128, id="one-block-per-line-many-lines"),
        # Lines at least a block long (the one-search-per-block path): exactly one block, and
        # one block plus a remainder spread over the first lines.
        pytest.param(1024, [16, 16, 8], [0, 15, 3], 64, id="lines-exactly-one-block"),
        pytest.param(1100, [16, 4, 1], [9, 2, 0], 64, id="lines-past-one-block"),
    ],
)
def test_grid_blocks_triton_equals_the_reference_index(S, strides, phases, blk):
    """The permutation and every per-block entry of ``grid_blocks_triton`` against the
    reference permutation, its line table and ``kv_block_runs`` (exact)."""
    from sparse_kernels.grid_index.blocks_triton import grid_blocks_triton

    st = torch.tensor(strides)
    ph = torch.tensor(phases)
    N = len(strides)
    vline = torch.tensor([True, False] * (N // 2) + [True] * (N % 2))
    slash = torch.tensor([True, True, False] * N)[:N]
    perm, blocks, v_hi, widths = _grid_blocks_reference(S, st, ph, vline, slash, blk)
    got = grid_blocks_triton(
        S, st.to(DEV), ph.to(DEV), vline.int().to(DEV), slash.int().to(DEV), blk, max(strides)
    )
    assert torch.equal(got[0].cpu(), perm)
    for i, name in enumerate(("kmin", "qmax", "s_lo", "s_hi", "runs")):
        assert torch.equal(got[1][i].cpu(), blocks[i]), name
    assert torch.equal(got[2].cpu(), v_hi)
    assert got[3].tolist() == widths
