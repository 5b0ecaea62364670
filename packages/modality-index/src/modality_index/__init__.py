"""Which token is text, image or video frame, and the permutations across modality boundaries."""

from importlib import metadata as _metadata

from .layout import Modality, ModalityLayout, VisualItem

__all__ = ["Modality", "ModalityLayout", "VisualItem"]
try:
    __version__ = _metadata.version("modality-index")
except _metadata.PackageNotFoundError:  # imported from a source folder on PYTHONPATH, not installed
    __version__ = "0+unknown"
