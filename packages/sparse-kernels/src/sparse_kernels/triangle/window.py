"""The triangle's window classes: what picks its launch config and its engine under ``auto``."""

# A window of at most this many keys gives each row tile a short key loop, which wants other tiles
# than a long one: on an H100 at 128K, (sink 8, window 512, last 128) takes 3.88 ms with 64x32
# tiles and 4.61 with 128x128, (128, 4096, 128) 19.88 and 16.98 ms
# (results/triangle/triangle-configs-by-window-H100-2026-11-27.json). With those tiles our Triton
# kernel is as fast as the FA4 engine or faster on the small window, and the FA4 engine wins on
# the large one (docs/kernels/fa4.md). Only windows of 512 and 4096 keys were measured: 1024 is a
# cut between them, not a measured crossover.
NARROW_WINDOW = 1024


def window_class(window: int) -> str:
    """``"narrow"`` for a window of at most :data:`NARROW_WINDOW` keys, else ``"wide"``: the
    triangle's variant in the tuning tables and in ``sparse_kernels.fa4.AUTO_FA4``."""
    return "narrow" if window <= NARROW_WINDOW else "wide"
