"""The one result type every attention op returns."""

from __future__ import annotations

from typing import NamedTuple

import torch


class AttentionOutput(NamedTuple):
    """Result of an attention op.

    Attributes:
        out: ``[B, H, S_Q, D]``, the dtype of ``q``. A query row that attended no key is 0.
        lse: ``[B, H, S_Q]`` float32, the natural-log log-sum-exp of the scaled scores of the keys
            the row attended; ``-inf`` for a row that attended no key.
    """

    out: torch.Tensor
    lse: torch.Tensor
