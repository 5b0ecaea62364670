"""The CLI's fixed vocabularies, importable without torch (``--help`` stays fast)."""

from __future__ import annotations

METHODS = ("dense", "mminference", "trianglemix", "mminference+trianglemix")
DTYPES = ("bfloat16", "float16", "float32")  # torch's names, as in spava-run
