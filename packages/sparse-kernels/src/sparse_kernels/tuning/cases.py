"""What the tuner times: one case per tuned op, built like the calls a prefill makes.

A case turns a model's attention shape and a key length into a tuple of :class:`Prepared` calls,
one per variant of the op that is tuned (one for every op but ``vertical_slash``,
``permuted`` and ``triangle``): random inputs with the structure of a real call (the block sizes, list densities and permutations the planners
launch with), the lookup key the op's launcher asks ``choose_config`` for on those inputs
(variant, blocks, length), and a function that launches the op's kernel with a given
:class:`~sparse_kernels.tuning.LaunchConfig`. Inputs are seeded: two runs time the same work.

The shapes, and where they come from:

* ``attention``: dense causal (TriangleMix's dense and last-row layers, the fallback of the
  sparse methods).
* ``block_sparse``: FlexAttention-style lists over 128x128 blocks, about 10% of the causal
  blocks per query block (plus the first and the diagonal block, as a causal ``create_block_mask``
  gives them: off-diagonal blocks full, the diagonal partial).
* ``permuted``: a Grid head's plan: rows and keys in grid order (stride = tokens per frame), each
  query block listing the earlier blocks of its grid line and the first block, and the blocks
  that are runs of the grid stride split off as the planner splits them; at two block sizes,
  each its own table entry (variant ``"causal-64x64"``, ``"causal-128x128"``): the planner's
  default 64x64 and the 128x128 of ``plan_layer(block=128)`` (``vlm-accel --block 128``). On an
  H100 the two want different tiles (``results/grid/permuted-configs-H100-2026-11-26.json``).
* ``triangle``: two window classes, each its own table entry (``triangle.window.window_class``):
  ``triangle_attention(sink=128, window=4096, last=128)``, TriangleMix's deep-layer shape at
  long context (the TTFT benchmark's; variant ``"wide"``, every window over 1024 keys), and
  ``triangle_mix.LayerPolicy``'s default (sink 8, window 512, last 128; variant ``"narrow"``),
  whose short window loop wants narrower tiles.
* ``vertical_slash``: MInference's default 1000 verticals and 1024 slashes
  (``sparse_patterns.VerticalSlash``) at two tile shapes, each its own table entry (variant
  ``"64x64"``, ``"128x128"``): the planner's 64x64 blocks, and the 128x128 blocks of
  ``vertical_slash_attention(block_m=128, block_n=128)`` (FA4's path's tile, and what a caller
  without FA4 may pass). Both calls share q, k, v and the indices.
* ``line_scores``: the estimators' last 64 query rows (``VerticalSlash.last_q``,
  ``Grid.last_q``) against every key.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from types import MappingProxyType

import torch

from .configs import KernelSpec, LaunchConfig
from .table import DTYPES

PLANNER_BLOCK = 64  # sparse_patterns.plan_layer's block (block_m = block_n)
VERTICAL_SLASH_BLOCKS = (PLANNER_BLOCK, 128)  # square tiles tuned for vertical_slash
PERMUTED_BLOCKS = (PLANNER_BLOCK, 128)  # square blocks tuned for permuted
BLOCK_SPARSE_BLOCK = 128
BLOCK_SPARSE_DENSITY = 0.10
TOKENS_PER_FRAME = 256  # Qwen2.5-VL: 448x448 frames after the 2x2 merge, the Grid stride
# (sink, window, last) per table variant, see the module docstring
TRIANGLE_SHAPES = MappingProxyType({"wide": (128, 4096, 128), "narrow": (8, 512, 128)})
N_VERTICAL, N_SLASH = 1000, 1024  # sparse_patterns.VerticalSlash defaults
LAST_Q = 64  # sparse_patterns.VerticalSlash / Grid last_q


@dataclass(frozen=True)
class TuneShape:
    """A model's attention shape: query heads, key/value heads, head dim and dtype name."""

    heads: int
    kv_heads: int
    head_dim: int
    dtype: str = "bfloat16"

    def __post_init__(self) -> None:
        for name in ("heads", "kv_heads", "head_dim"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"TuneShape.{name}: expected an int >= 1, got {value!r}")
        if self.heads % self.kv_heads:
            raise ValueError(
                f"TuneShape: expected heads divisible by kv_heads (GQA), got heads={self.heads}, "
                f"kv_heads={self.kv_heads}"
            )
        if self.dtype not in DTYPES:
            raise ValueError(f"TuneShape.dtype: expected one of {DTYPES}, got {self.dtype!r}")

    @property
    def group(self) -> int:
        return self.heads // self.kv_heads

    @property
    def torch_dtype(self) -> torch.dtype:
        return getattr(torch, self.dtype)


# Attention shapes of the models the project targets (the language model's heads, KV heads, head
# dim): the shipped tables are tuned for these.
MODEL_SHAPES = MappingProxyType(
    {
        "qwen2.5-vl-7b": TuneShape(28, 4, 128),
        "qwen2-vl-2b": TuneShape(12, 2, 128),
        "llava-onevision-7b": TuneShape(28, 4, 128),  # its language model is Qwen2-7B
        "smollm2-135m": TuneShape(9, 3, 64),
    }
)


@dataclass(frozen=True)
class Prepared:
    """One op's call at one length: the key its launcher looks up and a launch per config."""

    op: str
    variant: str
    blocks: tuple[int, ...]
    seq_len: int
    run: Callable[[LaunchConfig], object]


@dataclass(frozen=True)
class TuneCase:
    """``spec()`` imports the op's :class:`KernelSpec`; ``prepare(shape, S, device)`` builds the
    calls, one :class:`Prepared` per tuned variant (see the module docstring)."""

    op: str
    spec: Callable[[], KernelSpec]
    prepare: Callable[[TuneShape, int, torch.device], tuple[Prepared, ...]]


def _qkv(shape: TuneShape, S: int, device: torch.device, seed: int = 0):
    g = torch.Generator(device=device).manual_seed(seed)
    dt = shape.torch_dtype

    def rand(h: int) -> torch.Tensor:
        return torch.randn(1, h, S, shape.head_dim, generator=g, device=device, dtype=dt)

    return rand(shape.heads), rand(shape.kv_heads), rand(shape.kv_heads)


def _scale(shape: TuneShape) -> float:
    return shape.head_dim**-0.5


# ---- attention ----


def _attention_spec() -> KernelSpec:
    from ..attention.triton import SPEC

    return SPEC


def _attention(shape: TuneShape, S: int, device: torch.device) -> tuple[Prepared]:
    from ..attention.triton import _launch_attention_fwd

    q, k, v = _qkv(shape, S, device)
    scale = _scale(shape)

    def run(config: LaunchConfig):
        return _launch_attention_fwd(q, k, v, causal=True, scale=scale, config=config)

    return (Prepared("attention", "causal", (), S, run),)


# ---- block_sparse ----


def _block_sparse_spec() -> KernelSpec:
    from ..block_sparse.triton import SPEC

    return SPEC


def block_sparse_lists(H: int, S: int, block: int, density: float, device, seed: int = 0):
    """``(full_counts, full_indices, counts, indices)`` of a causal block mask listing, per
    query block and head, the first block, about ``density`` of the earlier blocks (full) and
    the diagonal block (partial), all int32 ``[1, H, NQB(, MAXB)]``."""
    from ..permuted.perms import block_lists_from_mask

    nb = -(-S // block)
    g = torch.Generator(device=device).manual_seed(seed)
    m = torch.arange(nb, device=device)
    earlier = m[None, :] < m[:, None]
    full = (torch.rand(H, nb, nb, generator=g, device=device) < density) & earlier
    full[:, 1:, 0] = True
    fidx, fcnt = block_lists_from_mask(full[None])
    idx = m.to(torch.int32).view(1, 1, nb, 1).expand(1, H, nb, 1).contiguous()
    cnt = torch.ones(1, H, nb, dtype=torch.int32, device=device)
    return fcnt, fidx, cnt, idx


def _block_sparse(shape: TuneShape, S: int, device: torch.device) -> tuple[Prepared]:
    from ..block_sparse.triton import _launch_block_sparse_fwd

    q, k, v = _qkv(shape, S, device)
    blk = BLOCK_SPARSE_BLOCK
    fcnt, fidx, cnt, idx = block_sparse_lists(shape.heads, S, blk, BLOCK_SPARSE_DENSITY, device)
    scale = _scale(shape)

    def run(config: LaunchConfig):
        return _launch_block_sparse_fwd(
            q, k, v, cnt, idx, fcnt, fidx, block_m=blk, block_n=blk, causal=True, scale=scale,
            config=config,
        )  # fmt: skip

    return (Prepared("block_sparse", "causal", (blk, blk), S, run),)


# ---- permuted ----


def _permuted_spec() -> KernelSpec:
    from ..permuted.triton import SPEC

    return SPEC


def grid_plan(H: int, S: int, block: int, stride: int, device):
    """A Grid head's plan for ``H`` heads (see the module docstring): ``(perm [1, H, S], idx,
    cnt, run_starts, run_counts)``, int32, lists ``[1, H, NB, W]``, as the planner launches
    it (runs of step ``stride`` split from the lists)."""
    from ..permuted.perms import (
        block_lists_from_mask,
        grid_line_offsets,
        grid_permutation,
        kv_block_runs,
        split_run_blocks,
    )

    stride = min(stride, S)
    offs = grid_line_offsets(S, stride, 0, device=device)
    perm = grid_permutation(S, stride, 0, device=device, offsets=offs, impl="reference").perm
    nb = -(-S // block)
    starts = offs[0, :stride].to(device)  # permuted position where each grid line starts
    first_row = torch.arange(nb, device=device) * block
    line_start = starts[torch.searchsorted(starts, first_row, right=True) - 1]
    m = torch.arange(nb, device=device)
    mask = (m[None, :] <= m[:, None]) & (m[None, :] >= (line_start // block)[:, None])
    mask[:, 0] = True
    idx, cnt = block_lists_from_mask(mask)
    perm = perm.view(1, 1, S).expand(1, H, S).contiguous()
    idx = idx.view(1, 1, nb, -1).expand(1, H, nb, idx.shape[-1]).contiguous()
    cnt = cnt.view(1, 1, nb).expand(1, H, nb).contiguous()
    runs = kv_block_runs(perm, block, stride)
    idx, cnt, rs, rc = split_run_blocks(
        perm, idx, cnt, block, step=stride, runs=runs, width=idx.shape[-1], impl="reference"
    )
    return perm, idx, cnt, rs, rc


def _permuted(shape: TuneShape, S: int, device: torch.device) -> tuple[Prepared, ...]:
    from ..permuted.triton import _launch_permuted_fwd
    from ..sparse_plan import SparsePlan

    q, k, v = _qkv(shape, S, device)
    step = torch.full((1, shape.heads), min(TOKENS_PER_FRAME, S), dtype=torch.int64, device=device)
    scale = _scale(shape)

    def prepared(blk: int) -> Prepared:
        perm, idx, cnt, rs, rc = grid_plan(shape.heads, S, blk, TOKENS_PER_FRAME, device)
        plan = SparsePlan(
            kv_indices=idx, kv_num_blocks=cnt, seq_lengths=(S, S), block_size=blk, q_perm=perm,
            kv_perm=perm, kv_run_starts=rs, kv_run_counts=rc, kv_run_step=step,
            check_contents=False,
        )  # fmt: skip

        def run(config: LaunchConfig):
            return _launch_permuted_fwd(q, k, v, plan, scale=scale, config=config)

        return Prepared("permuted", f"causal-{blk}x{blk}", (blk, blk), S, run)

    return tuple(prepared(blk) for blk in PERMUTED_BLOCKS)


# ---- triangle ----


def _triangle_spec() -> KernelSpec:
    from ..triangle.triton import SPEC

    return SPEC


def _triangle(shape: TuneShape, S: int, device: torch.device) -> tuple[Prepared, ...]:
    from ..triangle.triton import _launch_triangle_fwd

    q, k, v = _qkv(shape, S, device)
    scale = _scale(shape)

    def prepared(variant: str) -> Prepared:
        sink, window, last = TRIANGLE_SHAPES[variant]

        def run(config: LaunchConfig):
            return _launch_triangle_fwd(
                q, k, v, sink=sink, window=window, last=last, scale=scale, config=config
            )

        return Prepared("triangle", variant, (), S, run)

    return tuple(prepared(variant) for variant in TRIANGLE_SHAPES)


# ---- vertical_slash ----


def _vertical_slash_spec() -> KernelSpec:
    from ..vertical_slash.triton import SPEC

    return SPEC


def vertical_slash_indices(H: int, S: int, n_vertical: int, n_slash: int, device, seed: int = 0):
    """int32 ``(vertical [1, H, NV], slash [1, H, NS])``, rows strictly ascending: random key
    columns, and the first 64 diagonals (the local band every head keeps) plus random others."""
    g = torch.Generator(device=device).manual_seed(seed)
    nv, ns = min(n_vertical, S), min(n_slash, S)
    vert = torch.rand(H, S, generator=g, device=device).topk(nv, dim=-1).indices.sort(-1).values
    score = torch.rand(H, S, generator=g, device=device)
    score[:, : min(64, S)] = 2.0
    slash = score.topk(ns, dim=-1).indices.sort(-1).values
    return vert.to(torch.int32)[None], slash.to(torch.int32)[None]


def _vertical_slash(shape: TuneShape, S: int, device: torch.device) -> tuple[Prepared, ...]:
    from ..vertical_slash.index import build_vertical_slash_index
    from ..vertical_slash.triton import _launch_vertical_slash_fwd

    q, k, v = _qkv(shape, S, device)
    vert, slash = vertical_slash_indices(shape.heads, S, N_VERTICAL, N_SLASH, device)
    scale = _scale(shape)

    def prepared(blk: int) -> Prepared:
        index = build_vertical_slash_index(
            vert, slash, seq_len=S, block_m=blk, block_n=blk, check_contents=False
        )

        def run(config: LaunchConfig):
            return _launch_vertical_slash_fwd(q, k, v, index, scale=scale, config=config)

        return Prepared("vertical_slash", f"{blk}x{blk}", (blk, blk), S, run)

    return tuple(prepared(blk) for blk in VERTICAL_SLASH_BLOCKS)


# ---- line_scores ----


def _line_scores_spec() -> KernelSpec:
    from ..estimate.triton import SPEC

    return SPEC


def _line_scores(shape: TuneShape, S: int, device: torch.device) -> tuple[Prepared]:
    from ..estimate.triton import line_scores_triton

    q, k, _ = _qkv(shape, S, device)
    L = min(LAST_Q, S)
    rows = q[:, :, S - L :]
    scale = _scale(shape)

    def run(config: LaunchConfig):
        return line_scores_triton(rows, k, S - L, scale=scale, config=config)

    # the launcher's variant: its row tile, the power of two holding L rows (at least 16)
    return (Prepared("line_scores", f"rows{max(16, 1 << (L - 1).bit_length())}", (), S, run),)


CASES = MappingProxyType(
    {
        c.op: c
        for c in (
            TuneCase("attention", _attention_spec, _attention),
            TuneCase("block_sparse", _block_sparse_spec, _block_sparse),
            TuneCase("permuted", _permuted_spec, _permuted),
            TuneCase("triangle", _triangle_spec, _triangle),
            TuneCase("vertical_slash", _vertical_slash_spec, _vertical_slash),
            TuneCase("line_scores", _line_scores_spec, _line_scores),
        )
    }
)
OPS = tuple(CASES)
SPARSE_OPS = tuple(op for op in OPS if op != "attention")
