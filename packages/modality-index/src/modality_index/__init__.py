"""Which token is text, image or video frame, and the permutations across modality boundaries."""

from .layout import Modality, ModalityLayout, VisualItem

__all__ = ["Modality", "ModalityLayout", "VisualItem"]
__version__ = "0.1.0"
