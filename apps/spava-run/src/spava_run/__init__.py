"""spava-run: multi-GPU Spava prefill of a long video (torchrun / accelerate launch)."""

__all__: list[str] = []
__version__ = "0.1.0"
