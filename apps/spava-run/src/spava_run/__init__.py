"""spava-run: multi-GPU Spava prefill of a long video (torchrun / accelerate launch)."""

from importlib import metadata as _metadata

__all__: list[str] = []
try:
    __version__ = _metadata.version("spava-run")
except _metadata.PackageNotFoundError:  # imported from a source folder on PYTHONPATH, not installed
    __version__ = "0+unknown"
