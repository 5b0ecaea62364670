"""The optional FlashAttention-4 engine (``pip install 'sparse-kernels[hopper]'``).

With ``flash-attn-4`` installed, on a tested GPU (:data:`~sparse_kernels.fa4.support.ARCH_MAJORS`),
:func:`~sparse_kernels.attention`, :func:`~sparse_kernels.block_sparse_attention`,
:func:`~sparse_kernels.vertical_slash_attention` and :func:`~sparse_kernels.triangle_attention`
(with ``a_shape_attention``) take ``impl="fa4"``; ``impl="auto"`` picks FA4 where
:data:`AUTO_FA4` lists the op, GPU, dtype, head dim and, for block lists, block size (measured
faster there). Without the extra nothing changes: Triton stays the default engine. Every engine is
forward-only: FA4's calls run without autograd, like the Triton kernels.
"""

from .support import (
    AUTO_FA4,
    EXTRA_HINT,
    TESTED_VERSION,
    auto_prefers,
    available,
    block_lists_problem,
    problem,
    triangle_problem,
    version,
)

__all__ = [
    "AUTO_FA4",
    "EXTRA_HINT",
    "TESTED_VERSION",
    "auto_prefers",
    "available",
    "block_lists_problem",
    "problem",
    "triangle_problem",
    "version",
]
