"""The optional FlashAttention-4 engine (``pip install 'sparse-kernels[hopper]'``).

With ``flash-attn-4`` installed, on a tested GPU (:data:`~sparse_kernels.fa4.support.ARCH_MAJORS`),
:func:`~sparse_kernels.attention`, :func:`~sparse_kernels.block_sparse_attention` and
:func:`~sparse_kernels.triangle_attention` (with ``a_shape_attention``) take ``impl="fa4"``, and ``impl="auto"`` picks FA4 where it was measured faster (:data:`AUTO_FA4`). Without it nothing changes: Triton stays the default engine.
"""

from .support import (
    EXTRA_HINT,
    TESTED_VERSION,
    available,
    block_lists_problem,
    problem,
    triangle_problem,
    version,
)

# (op, compute-capability major) pairs where impl="auto" runs FA4 when FA4 can run the input:
# where it was measured faster than our Triton kernel (docs/results.md, "FA4 engine").
AUTO_FA4 = frozenset(
    {
        ("attention", 9),
        ("block_sparse_attention", 9),
        ("triangle_attention", 9),
    }
)

__all__ = [
    "AUTO_FA4",
    "EXTRA_HINT",
    "TESTED_VERSION",
    "available",
    "block_lists_problem",
    "problem",
    "triangle_problem",
    "version",
]
