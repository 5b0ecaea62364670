"""`python -m modality_index`: build a mixed text/video/image layout and check its permutation.

Runs on the CPU with only the package's own dependencies (no transformers).
"""

from __future__ import annotations

import sys

import torch

from modality_index import Modality, ModalityLayout, __version__


def main() -> int:
    # 12 text tokens, a 2-frame video of 6 tokens per frame, 5 text tokens, one 4-token image
    lay = ModalityLayout.from_spans(
        [(Modality.TEXT, 12), (Modality.VIDEO, 12, 6), (Modality.TEXT, 5), (Modality.IMAGE, 4)]
    )
    x = torch.randn(2, 4, lay.seq_len, 8, generator=torch.Generator().manual_seed(0))
    xs = lay.permute(x, dim=-2)
    checks = {
        "segments [0, 12, 24, 29, 33]": lay.seg_cu_seqlens.tolist() == [0, 12, 24, 29, 33],
        "frames [[12, 18], [18, 24], [29, 33]]": lay.frame_spans.tolist()
        == [[12, 18], [18, 24], [29, 33]],
        "modality order [0, 17, 21, 33]": lay.modality_cu_seqlens.tolist() == [0, 17, 21, 33],
        "unpermute(permute(x)) == x": torch.equal(lay.unpermute(xs, dim=-2), x),
    }
    counts = ", ".join(f"{m.name.lower()} {c}" for m, c in lay.counts().items())
    print(f"modality_index {__version__}: layout of {lay.seq_len} tokens ({counts})")
    for name, ok in checks.items():
        print(f"  {name}: {'OK' if ok else 'FAILED'}")
    return 0 if all(checks.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
