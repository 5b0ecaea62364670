"""The providers every attention benchmark suite runs, built the same way for every suite: our ops
(``impl=`` auto, triton, fa4), FlashAttention-4 called directly, FlexAttention on its Triton and
FA4 (``FLASH``) backends, cuDNN SDPA and MInference 0.1.6; FA4's dense rate as the anchor of
every ratio; a float32 oracle over a few rows; the summary table. Peer packages are imported on
use: a missing one is a :class:`ProviderUnavailable` that names it, never a substitute."""

from __future__ import annotations

import importlib
from collections.abc import Callable

import torch

from .benchmarking import (
    Anchor,
    _repeat_kv,
    attention_flops,
    causal_pairs,
    cuda_time_ms,
    tflops,
)
from .kernel_profile import profile_line

# The provider axis of every attention suite, in table order. ``ours-*`` run our op with
# ``impl=`` the suffix; the others are the peers.
PROVIDERS = (
    "ours-auto", "ours-triton", "ours-fa4", "fa4", "flex-triton", "flex-fa4", "cudnn", "minference",
)  # fmt: skip

# Qwen2.5-VL-7B's attention (B, H, H_KV, D), bf16 and causal in every suite.
QWEN25_VL_7B = (1, 28, 4, 128)
# The oracle: the last ORACLE_ROWS query rows of the first ORACLE_HEADS heads in float32; a
# provider's output must be within REL_TOL (relative Frobenius error) of it before it is timed.
ORACLE_HEADS, ORACLE_ROWS, REL_TOL = 2, 256, 2e-2


class ProviderUnavailable(Exception):
    """A provider cannot run here: its package is missing, or it has no such op. The message
    names the package or the op; the suites report it as a skip with that reason."""


def require_package(provider: str) -> None:
    """Raise :class:`ProviderUnavailable` naming the package a peer provider needs when it does
    not import here; our own providers and the torch ones need nothing more."""
    if provider not in PROVIDERS:
        raise ValueError(f"provider must be one of {PROVIDERS}, got {provider!r}")
    module, dist = {
        "fa4": ("flash_attn.cute", "flash-attn-4"),
        "flex-fa4": ("flash_attn.cute", "flash-attn-4 (FlexAttention's FLASH backend)"),
        "minference": ("minference", "minference 0.1.6 (built from its sdist)"),
    }.get(provider, (None, None))
    if module is None:
        return
    try:
        importlib.import_module(module)
    except ImportError as e:
        raise ProviderUnavailable(f"{provider}: {dist} is not importable ({e})") from e


def ours_impl(provider: str) -> str:
    """The ``impl=`` of an ``ours-*`` provider."""
    if provider not in PROVIDERS or not provider.startswith("ours-"):
        raise ValueError(f"an ours-* provider of {PROVIDERS} expected, got {provider!r}")
    return provider.removeprefix("ours-")


def first_call(provider: str, fn: Callable[[], torch.Tensor]) -> torch.Tensor:
    """Run ``fn`` once, before the timed rounds (JIT compiles happen here), and return its output.
    Our op with ``impl="fa4"`` raises ``ImportError`` / ``NotImplementedError`` naming why FA4
    cannot run the input: that becomes :class:`ProviderUnavailable`; every other error stays."""
    try:
        return fn()
    except (ImportError, NotImplementedError) as e:
        if provider != "ours-fa4":
            raise
        raise ProviderUnavailable(f"{provider}: {e}") from e


def checked_call(
    provider: str,
    make: Callable[[], Callable[[], torch.Tensor]],
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask_rows: torch.Tensor,
) -> tuple[Callable[[], torch.Tensor], float]:
    """Build a provider's call with ``make``, run it once (:func:`first_call`) and return it with
    its :func:`rows_error` against the oracle over ``mask_rows``, before anything is timed.
    Raises :class:`ProviderUnavailable` where the provider cannot run (the suites skip)."""
    fn = make()
    out = first_call(provider, fn)
    err = rows_error(out, q, k, v, mask_rows)
    del out
    return fn, err


def fa4_dense_call(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> Callable:
    """FlashAttention-4 dense causal attention on our ``[B, H, S, D]`` tensors (FA4 reads the
    ``[B, S, H, D]`` views as they are), with the LSE as ours returns it."""
    from flash_attn.cute import flash_attn_func

    scale = q.shape[-1] ** -0.5
    qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))

    def run():
        out, _ = flash_attn_func(qt, kt, vt, softmax_scale=scale, causal=True, return_lse=True)
        return out.transpose(1, 2)

    return run


def fa4_block_sparse_call(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, block_mask
) -> Callable:
    """FlashAttention-4 over a causal ``BlockMask``'s lists as they are (partial lists as FA4's
    mask lists, full lists as its full lists), the causal rule applied in the partial tiles."""
    from flash_attn.cute import flash_attn_func
    from flash_attn.cute.block_sparsity import BlockSparseTensorsTorch

    tensors = BlockSparseTensorsTorch(
        mask_block_cnt=block_mask.kv_num_blocks,
        mask_block_idx=block_mask.kv_indices,
        full_block_cnt=block_mask.full_kv_num_blocks,
        full_block_idx=block_mask.full_kv_indices,
        block_size=tuple(int(b) for b in block_mask.BLOCK_SIZE),
    )
    scale = q.shape[-1] ** -0.5
    qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))

    def run():
        out, _ = flash_attn_func(
            qt, kt, vt, softmax_scale=scale, causal=True, block_sparse_tensors=tensors,
            return_lse=True,
        )  # fmt: skip
        return out.transpose(1, 2)

    return run


# A suite compiles FlexAttention once per (mask_mod constants, list shapes, backend): more
# variants than dynamo's default recompile limit (8), past which it would run flex eagerly.
FLEX_RECOMPILE_LIMIT = 64


def flex_call(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, block_mask, provider: str):
    """Compiled FlexAttention with ``block_mask``: ``"flex-triton"`` on its Triton backend,
    ``"flex-fa4"`` on its FA4 one (``kernel_options={"BACKEND": "FLASH"}``); the mask's
    ``mask_mod`` runs in its partial blocks. Compiles here, under :data:`FLEX_RECOMPILE_LIMIT`
    (a scoped dynamo setting), so the returned call only runs the compiled kernel."""
    from .testing import _compiled_flex, flex_attention_compiled

    if provider not in ("flex-triton", "flex-fa4"):
        raise ValueError(f"provider must be 'flex-triton' or 'flex-fa4', got {provider!r}")
    opts = {"BACKEND": "FLASH"}

    def run():
        if provider == "flex-triton":
            return flex_attention_compiled(q, k, v, block_mask)
        return _compiled_flex()(
            q, k, v, block_mask=block_mask, enable_gqa=True, kernel_options=opts
        )

    with torch._dynamo.config.patch(recompile_limit=FLEX_RECOMPILE_LIMIT):
        run()
    return run


# MInference's row and key tiles (its CUDA index conversion asserts 64x64).
MINFERENCE_TILE = 64


def minference_vertical_slash_call(q, k, v, vertical: torch.Tensor, slash: torch.Tensor):
    """MInference 0.1.6 ``vertical_slash_sparse_attention(q, k, v, v_idx, s_idx)`` on our
    ``[B, H, S, D]`` tensors. ``vertical`` ``[B, H, NV]`` are key positions, ``slash``
    ``[B, H, NS]`` diagonal offsets ``i - j``, as MInference's own callers pass them; any integer
    dtype and order (the call casts to int32 and sorts them, then converts them to 64x64 tiles,
    all inside the timed call, as ours builds its index). Its attended set is its own, not our
    aligned tiles: :func:`minference_vertical_slash_rows`. It has no GQA: K/V are repeated to the
    query heads here, once. Every head needs the offset-0 slash: MInference's callers always
    select the nearest diagonals, and its conversion reads past a head's list when no offset is
    below 64."""
    if vertical.shape[:2] != q.shape[:2] or slash.shape[:2] != q.shape[:2]:
        raise ValueError(
            f"vertical and slash must be [B, H, n] with (B, H) = {tuple(q.shape[:2])}, got "
            f"{tuple(vertical.shape)} and {tuple(slash.shape)}"
        )
    if slash.shape[-1] == 0:
        raise ValueError("minference: every head's slash offsets must include 0, got NS=0")
    mins = slash.amin(-1)
    if bool((mins != 0).any()):
        raise ValueError(
            "minference: every head's slash offsets must include 0 and be >= 0, got minimum "
            f"offsets {mins.flatten()[:8].tolist()} (first heads)"
        )
    from minference import vertical_slash_sparse_attention

    kk, vv = _repeat_kv(q, k, v)
    return lambda: vertical_slash_sparse_attention(q, kk, vv, vertical, slash)


def minference_vertical_slash_rows(
    vertical: torch.Tensor, slash: torch.Tensor, S: int
) -> torch.Tensor:
    """The keys MInference 0.1.6's ``vertical_slash_sparse_attention`` attends for the oracle rows
    (the last :data:`ORACLE_ROWS` rows of the first :data:`ORACLE_HEADS` heads of batch 0): bool
    ``[ORACLE_HEADS, ORACLE_ROWS, S]``, the same rule as its CUDA index conversion. Per 64-row
    block ending at ``e``, a slash ``d < e`` covers the 64 keys ``[e - d - 64, e - d)`` (at least
    ``[0, 64)``), not aligned to 64; slashes are taken from the farthest, and a band that starts
    inside the current range grows that range by a whole 64 keys; the ranges run causally. A
    vertical column is added where no range covers it, and dropped past the last range. Used
    only on the few oracle rows, so a plain loop mirrors the kernel."""
    T = MINFERENCE_TILE
    if S % T or ORACLE_ROWS % T:
        raise ValueError(f"S and ORACLE_ROWS must be multiples of {T}, got {S}, {ORACLE_ROWS}")
    mask = torch.zeros(ORACLE_HEADS, ORACLE_ROWS, S, dtype=torch.bool)
    for h in range(ORACLE_HEADS):
        cols_all = sorted(vertical[0, h].tolist())
        offs = sorted(slash[0, h].tolist(), reverse=True)
        if not offs or offs[-1] != 0:
            raise ValueError(f"head {h}: the slash offsets must include 0, got min {offs[-1:]}")
        for start in range(S - ORACLE_ROWS, S, T):
            end = start + T
            ranges, cols = [], []
            dists = iter(max(end - d, T) for d in offs if d < end)
            verts = iter(cols_all)
            hi = next(dists)
            lo = hi - T
            col = next(verts, end + T)
            while True:
                if col < hi:
                    if col < lo:
                        cols.append(col)
                    col = next(verts, end + T)
                    continue
                nxt = next(dists, None)
                if nxt is None:
                    ranges.append((lo, hi))
                    break
                if nxt > hi + T:
                    ranges.append((lo, hi))
                    lo, hi = nxt - T, nxt
                elif nxt > hi:
                    hi += T
            rows = slice(start - (S - ORACLE_ROWS), end - (S - ORACLE_ROWS))
            for a, b in ranges:
                mask[h, rows, a : min(b, S)] = True
            mask[h, rows, cols] = True
    return mask & causal_rows_mask(S, "cpu")


def minference_streaming_call(q, k, v, *, sink: int, window: int):
    """MInference 0.1.6 ``streaming_forward(q, k, v, n_init, n_local)`` on our ``[B, H, S, D]``
    tensors: row ``i`` attends ``j <= i`` with ``i - j < window`` (``n_local``, the diagonal
    included) or ``j < sink`` (``n_init``), the A-shape. It has no GQA (q, k and v must have one
    shape): K/V are repeated to the query heads here, once. Its Triton kernel autotunes on the
    first call."""
    from minference import streaming_forward

    kk, vv = _repeat_kv(q, k, v)
    return lambda: streaming_forward(q, kk, vv, sink, window)


def fa4_dense_anchor(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, rep: int) -> Anchor:
    """Time FA4 dense causal attention on these inputs (its JIT compile in the warm-up)."""
    try:
        require_package("fa4")
    except ProviderUnavailable as e:
        return Anchor(None, None, str(e))
    ms = cuda_time_ms(fa4_dense_call(q, k, v), warmup=2, rep=rep)
    B, H, S, D = q.shape
    return Anchor(tflops(attention_flops(B, H, causal_pairs(S, S), D), ms / 1e3), ms)


def qwen_inputs(S: int, *, h_kv: int = QWEN25_VL_7B[2], seed: int = 0):
    """Seeded bf16 ``q [1, 28, S, 128]``, ``k, v [1, h_kv, S, 128]`` on the GPU."""
    B, H, _, D = QWEN25_VL_7B
    g = torch.Generator(device="cuda").manual_seed(seed)
    q = torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16, generator=g)
    k = torch.randn(B, h_kv, S, D, device="cuda", dtype=torch.bfloat16, generator=g)
    v = torch.randn(B, h_kv, S, D, device="cuda", dtype=torch.bfloat16, generator=g)
    return q, k, v


def causal_rows_mask(S: int, device: torch.device | str) -> torch.Tensor:
    """The oracle rows' mask (``[ORACLE_HEADS, ORACLE_ROWS, S]``) of causal attention."""
    i = torch.arange(S - ORACLE_ROWS, S, device=device)[:, None]
    return (torch.arange(S, device=device)[None, :] <= i).expand(ORACLE_HEADS, -1, -1)


def rows_error(
    out: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask_rows: torch.Tensor
) -> float:
    """Relative (Frobenius) error of ``out``'s last rows of its first heads against float32
    attention restricted to ``mask_rows`` (bool ``[h, r, S_KV]``: the attended keys of query rows
    ``S_Q - r .. S_Q - 1`` of heads ``0 .. h-1``). A few hundred rows keep the oracle cheap at
    1M tokens while covering the op's full key range."""
    from .attention import masked_attention_reference

    h, r, _ = mask_rows.shape
    group = q.shape[1] // k.shape[1]
    if h % group and h > group:
        raise ValueError(f"rows_error: {h} heads must be a multiple of the GQA group {group}")
    n_kv = -(-h // group)
    ref = masked_attention_reference(
        q[:, :h, -r:], k[:, :n_kv], v[:, :n_kv], mask_rows[None], scale=q.shape[-1] ** -0.5
    ).out.float()
    return float((out[:, :h, -r:].float() - ref).norm() / ref.norm())


# A sample whose interquartile range exceeds this fraction of its median does not resolve a
# target's verdict: the summary says so beside it.
RESOLVED_SPREAD = 0.10


def _spread_note(samples: dict[str, dict]) -> str:
    """``"; <provider>'s IQR is N% of its median: not resolved"`` for the widest of ``samples``
    whose relative interquartile range exceeds :data:`RESOLVED_SPREAD`, else ``""``."""
    spreads = {p: r["iqr_ms"] / r["median_ms"] for p, r in samples.items() if "iqr_ms" in r}
    wide = max(spreads, key=spreads.get, default=None)
    if wide is None or spreads[wide] <= RESOLVED_SPREAD:
        return ""
    return f"; {wide}'s IQR is {100 * spreads[wide]:.0f}% of its median: not resolved"


def summary_lines(
    title: str,
    results: dict[tuple[str, str], dict],
    cases: list[str],
    targets: dict[str, tuple[str, float]] | None = None,
    rate_target: float | None = None,
) -> list[str]:
    """A compact table: per case, each provider's median ms, ``ours-auto``'s useful rate over
    FA4's dense rate, ``ours-auto``'s speed-up over the fastest peer computing the same op
    (``extra_info["same_op"]``; the dense baselines of sparse suites are left out) and, where
    ``targets[case] = (peer, speed-up)`` names one, whether ``ours-auto`` meets it, by how
    much it misses, and whether either sample is too spread to tell (:data:`RESOLVED_SPREAD`).
    ``rate_target``: the least useful rate over FA4's dense rate, judged the same way (the
    spread note names ``ours-auto`` only: the FA4 anchor's spread is not recorded). Under a
    missed target, the line that follows says where ``ours-auto``'s time went, from its
    profiled call (``extra_info["kernels_ms"]``, :mod:`sparse_kernels.kernel_profile`)."""
    cols = [p for p in PROVIDERS if any((c, p) in results for c in cases)]
    lines = [title, f"{'case':<30}" + "".join(f"{p:>12}" for p in cols)
             + f"{'ours/fa4d':>10}{'best peer':>12}{'speed-up':>9}  target"]  # fmt: skip
    for c in cases:
        row = {p: results[(c, p)] for p in cols if (c, p) in results}
        if not row:
            continue
        line = f"{c:<30}" + "".join(
            f"{row[p]['median_ms']:12.2f}" if p in row else f"{'-':>12}" for p in cols
        )
        ours = row.get("ours-auto")
        ratio = ours.get("ratio_to_fa4_dense") if ours else None
        line += f"{ratio:10.2f}" if ratio is not None else f"{'-':>10}"
        peers = {p: r["median_ms"] for p, r in row.items()
                 if not p.startswith("ours-") and r.get("same_op")}  # fmt: skip
        best = min(peers, key=peers.get) if ours and peers else None
        line += f"{best:>12}{peers[best] / ours['median_ms']:9.2f}" if best else f"{'-':>21}"
        peer, want = (targets or {}).get(c, (None, None))
        missed = False
        if peer is not None and ours and peer in row:
            got = row[peer]["median_ms"] / ours["median_ms"]
            missed = got < want
            verdict = f"missed by {100 * (1 - got / want):.0f}%" if missed else "met"
            verdict += _spread_note({"ours-auto": ours, peer: row[peer]})
            line += f"  >= {want:.2f}x {peer}: {got:.2f}x, {verdict}"
        if rate_target is not None and ratio is not None:
            short = ratio < rate_target
            missed |= short
            verdict = f"missed by {100 * (1 - ratio / rate_target):.0f}%" if short else "met"
            verdict += _spread_note({"ours-auto": ours})
            line += f"  ours/fa4d >= {rate_target:.2f}: {verdict}"
        lines.append(line)
        if missed and ours.get("kernels_ms"):
            lines.append(
                f"{'':<30}ours-auto, one profiled call: "
                + profile_line(ours["kernels_ms"], ours["median_ms"])
            )
    return lines


def write_summary(request, lines: list[str]) -> None:
    """Print ``lines`` in pytest's terminal summary (a module fixture's teardown calls this)."""
    tr = request.config.pluginmanager.get_plugin("terminalreporter")
    for line in ["", *lines]:
        tr.write_line(line) if tr is not None else print(line)
