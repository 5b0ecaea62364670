"""vlm-accel: long-video VLM prefill with MMInference and TriangleMix (a thin CLI over the libraries)."""

__version__ = "0.1.0"
