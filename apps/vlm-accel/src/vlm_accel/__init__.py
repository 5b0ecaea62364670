"""vlm-accel: long-video VLM prefill with MMInference and TriangleMix (a thin CLI over the libraries)."""

from importlib import metadata as _metadata

try:
    __version__ = _metadata.version("vlm-accel")
except _metadata.PackageNotFoundError:  # imported from a source folder on PYTHONPATH, not installed
    __version__ = "0+unknown"
