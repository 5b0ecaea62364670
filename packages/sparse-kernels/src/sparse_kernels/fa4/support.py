"""Whether FlashAttention-4 (``flash-attn-4``, ``flash_attn.cute``) can run an input, and why not.

Nothing here imports ``flash_attn``: :func:`import_problem` tries it once, on first use, so that
``import sparse_kernels`` stays light and a machine without the extra never pays for it.
"""

from __future__ import annotations

import functools
from importlib import metadata

import torch
from packaging.version import InvalidVersion, Version

from .._validate import TRITON_MAX_HEAD_DIM

EXTRA_HINT = "pip install 'sparse-kernels[hopper]'"
# The FA4 release this engine is written and tested against (the `hopper` extra pins it); FA4 is
# a beta whose interface moves between releases, so another version is refused, not guessed at.
TESTED_VERSION = "4.0.0b36"
# Compute-capability majors the engine runs on: tested on sm90 (H100, H200) only.
ARCH_MAJORS = (9,)
DTYPES = (torch.float16, torch.bfloat16)
# FA4's sm90 kernels: head dims 8..256 in steps of 8 (16-byte rows in fp16/bf16).
HEAD_DIM_RANGE = (8, 256)
HEAD_DIM_STEP = 8
# Block-sparse on sm90: FA4's tile must divide the sparse block. Its tile is 128x128 up to head
# dim 128 and shrinks to 64 rows / 64 keys when the blocks ask for it; larger head dims use
# other tiles, so block lists run up to head dim 128.
# (block_sparse_attention refuses other block sizes itself; the check here is the engine's own
# statement, for any caller of block_lists_problem.)
BLOCK_SIZES = (64, 128)
BLOCK_SPARSE_MAX_HEAD_DIM = 128


@functools.cache
def import_problem() -> str | None:
    """``None`` when the tested ``flash_attn.cute`` imports, else the reason (once per process).
    Any failure counts (a CUDA DSL library that does not load raises more than ImportError):
    the reason names it, and ``impl="auto"`` then runs Triton."""
    try:
        import flash_attn.cute  # noqa: F401
    except Exception as e:  # noqa: BLE001 - reported, never swallowed: it becomes the reason
        return (
            f"flash-attn-4 is not importable ({type(e).__name__}: {e}); install it with "
            f"{EXTRA_HINT}"
        )
    got = version()
    try:
        same = got is not None and Version(got) == Version(TESTED_VERSION)
    except InvalidVersion:
        same = False
    if not same:
        return (
            f"needs flash-attn-4 {TESTED_VERSION} (the version it is tested with), got {got}; "
            f"install it with {EXTRA_HINT}"
        )
    return None


def version() -> str | None:
    """The installed ``flash-attn-4`` version, or ``None``."""
    try:
        return metadata.version("flash-attn-4")
    except metadata.PackageNotFoundError:
        return None


def available(device: torch.device | str | None = None) -> bool:
    """True when FA4 imports and ``device`` (default: the current CUDA device) is a GPU this
    engine runs on (:data:`ARCH_MAJORS`)."""
    if not torch.cuda.is_available():
        return False
    dev = torch.device("cuda") if device is None else torch.device(device)
    return dev.type == "cuda" and _arch_problem(dev) is None and import_problem() is None


def _arch_problem(device: torch.device) -> str | None:
    major, minor = torch.cuda.get_device_capability(device)
    if major not in ARCH_MAJORS:
        want = ", ".join(f"sm{m}0" for m in ARCH_MAJORS)
        return f"needs a GPU of compute capability {want} (tested there), got sm{major}{minor}"
    return None


Problem = tuple[type[Exception], str]


def problem(q: torch.Tensor) -> Problem | None:
    """Why FA4 cannot run dense attention on ``q``'s device, dtype and head dim:
    ``(exception type, reason)``, or ``None`` when it can. Cheap: no kernel launch, no host
    synchronisation; the package import is tried last, once per process."""
    return _problem(q, None)


def block_lists_problem(
    q: torch.Tensor, *, block_size: tuple[int, int], causal: bool, S_KV: int
) -> Problem | None:
    """:func:`problem` for block lists of ``block_size``. Without ``causal``, ``S_KV`` must be a
    multiple of the key block: FA4 bounds the keys only in the first tile it visits per query
    block, which need not be the last key block of our lists (with ``causal`` the diagonal
    already hides every key past ``S_KV``)."""
    if not causal and S_KV % block_size[1]:
        return NotImplementedError, (
            f"runs non-causal block lists only when S_KV is a multiple of block_n: got "
            f"S_KV={S_KV}, block_n={block_size[1]}"
        )
    return _problem(q, block_size)


def triangle_problem(q: torch.Tensor) -> Problem | None:
    """:func:`problem` for the triangle and A-shape ops, whose sink and last-row parts are our
    Triton kernels (head dims up to ``TRITON_MAX_HEAD_DIM``)."""
    if q.shape[-1] > TRITON_MAX_HEAD_DIM:
        return NotImplementedError, (
            f"runs triangle attention up to head dim {TRITON_MAX_HEAD_DIM} (its sink and "
            f"last-row parts are Triton kernels), got {q.shape[-1]}"
        )
    return _problem(q, None)


def _problem(q: torch.Tensor, block_size: tuple[int, int] | None) -> Problem | None:
    # What the input asks for first (testable anywhere), then the machine, then the package.
    if q.dtype not in DTYPES:
        return NotImplementedError, f"needs float16 or bfloat16 tensors, got {q.dtype}"
    D = q.shape[-1]
    lo, hi = HEAD_DIM_RANGE
    if not (lo <= D <= hi and D % HEAD_DIM_STEP == 0):
        return NotImplementedError, (
            f"needs a head dim in {lo}..{hi} divisible by {HEAD_DIM_STEP}, got {D}"
        )
    if block_size is not None:
        if D > BLOCK_SPARSE_MAX_HEAD_DIM:
            return NotImplementedError, (
                f"runs block lists up to head dim {BLOCK_SPARSE_MAX_HEAD_DIM}, got {D}"
            )
        if any(b not in BLOCK_SIZES for b in block_size):
            return NotImplementedError, (
                f"runs block lists of block sizes in {BLOCK_SIZES} per side, got {block_size}"
            )
    if q.device.type != "cuda":
        return ValueError, f"needs CUDA tensors, got tensors on {q.device}"
    arch = _arch_problem(q.device)
    if arch is not None:
        return NotImplementedError, arch
    missing = import_problem()
    if missing is not None:
        return ImportError, missing
    return None


# Where impl="auto" runs FA4 (when FA4 can run the input): (op, compute-capability major, dtype,
# head dim, variant), each measured faster than our Triton kernel there (docs/kernels/fa4.md, whose
# table gives the figures and the one shape where an entry is not faster). The variant is the block
# size (BLOCK_M, BLOCK_N) of the ops that take block lists (FA4's 64-row tiles are slower than its
# 128-row ones), the window class of the triangle (triangle.window.window_class: with a window of
# at most 1024 keys our Triton kernel is as fast or faster), else None.
AUTO_FA4 = frozenset(
    {
        ("attention", 9, torch.bfloat16, 128, None),
        ("block_sparse_attention", 9, torch.bfloat16, 128, (128, 128)),
        ("triangle_attention", 9, torch.bfloat16, 128, "wide"),
        ("vertical_slash_attention", 9, torch.bfloat16, 128, (128, 128)),
    }
)


def auto_prefers(op: str, q: torch.Tensor, variant: tuple[int, int] | str | None = None) -> bool:
    """Whether :data:`AUTO_FA4` lists ``op`` for ``q``'s GPU, dtype and head dim, and ``variant``
    (the block size of the block-list ops, the triangle's window class, else None)."""
    if q.device.type != "cuda":
        return False
    major = torch.cuda.get_device_capability(q.device)[0]
    return (op, major, q.dtype, q.shape[-1], variant) in AUTO_FA4
