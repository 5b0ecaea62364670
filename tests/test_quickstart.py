"""Every ```python snippet of docs/quickstart.md, run in order, and a check that each patch ran.

The snippets under one ``## `` heading continue each other: they run in one namespace, a fresh one
per heading. A snippet's own ``assert``s are its claims; around them, the ops that each patch
should reach are counted, so a patch that silently ran dense attention fails here. On a CPU the
Triton kernels run under the interpreter (the root conftest sets ``TRITON_INTERPRET=1`` before
anything imports triton).
"""

from __future__ import annotations

import collections
import linecache
from dataclasses import dataclass
from pathlib import Path

import pytest
from modality_index import ModalityLayout

pytest.importorskip("transformers")

REPO = Path(__file__).resolve().parents[1]
DOC = REPO / "docs" / "quickstart.md"


@dataclass(frozen=True)
class Snippet:
    line: int  # line of docs/quickstart.md holding the snippet's first line of code
    source: str


def python_snippets(text: str) -> dict[str, list[Snippet]]:
    """``## `` heading -> its ```python snippets, in document order (other fences skipped)."""
    sections: dict[str, list[Snippet]] = {}
    heading, fence, start, body = None, None, 0, []
    for number, line in enumerate(text.splitlines(), start=1):
        if fence is None:
            if line.startswith("## "):
                heading = line[3:].strip()
            elif line.startswith("```"):
                fence, start, body = line[3:].strip(), number + 1, []
        elif line.startswith("```"):
            if fence == "python":
                if heading is None:
                    raise ValueError(f"{DOC}:{start}: a python snippet before the first ## heading")
                sections.setdefault(heading, []).append(Snippet(start, "\n".join(body) + "\n"))
            fence = None
        else:
            body.append(line)
    if fence is not None:
        raise ValueError(f"{DOC}:{start - 1}: a ``` fence that is never closed")
    return sections


SNIPPETS = python_snippets(DOC.read_text())

# Calls of the ops each section's patches must reach (module, attribute -> counter name); the
# patches look these names up at call time, so wrapping the module attribute sees every call.
COUNTED = {
    ("triangle_mix.integrations.hf", "triangle_attention"): "triangle",
    ("sparse_patterns.mminference", "mminference_attention"): "mminference",
    ("sparse_patterns", "mminference_attention"): "mminference",
    ("sparse_kernels.integrations.hf", "rms_norm"): "rms_norm",
    ("sparse_kernels.integrations.hf", "silu_mul"): "silu_mul",
    ("sparse_kernels.integrations.hf", "rotary"): "rotary",
}

# What each section must have called, per forward of its snippets:
EXPECTED_CALLS = {
    "The kernels alone": {},
    # triangle layers 2-3 of the Llama (one forward), both streaming layers of the Qwen2
    "TriangleMix on a Llama or Qwen2 model": {"triangle": 2 + 2},
    # all 4 layers with the shipped config, all 4 with the searched one; TriangleMix together
    # with MMInference: its 2 dynamic layers and its 2 triangle layers
    "MMInference on Qwen2.5-VL": {"mminference": 4 + 4 + 2, "triangle": 2},
    # 2 layers: 2 norms each and the final norm, one MLP gate and one rotary step each
    "Fused per-token ops": {"rms_norm": 2 * 2 + 1, "silu_mul": 2, "rotary": 2},
}


def test_quickstart_sections_are_the_ones_checked_here():
    assert list(SNIPPETS) == list(EXPECTED_CALLS)


@pytest.mark.parametrize("section", list(EXPECTED_CALLS))
def test_quickstart_section_runs(section, monkeypatch):
    import importlib

    calls: collections.Counter[str] = collections.Counter()
    layouts = []  # the layout argument of each mminference_attention call
    for (module_name, attr), counter in COUNTED.items():
        module = importlib.import_module(module_name)
        original = getattr(module, attr)

        def counted(*args, _original=original, _counter=counter, **kwargs):
            calls[_counter] += 1
            if _counter == "mminference":
                layouts.append(args[4] if len(args) > 4 else kwargs.get("layout"))
            return _original(*args, **kwargs)

        monkeypatch.setattr(module, attr, counted)
    monkeypatch.chdir(REPO)  # the snippets name files of the repository by relative path
    namespace: dict[str, object] = {"__name__": "quickstart"}
    for snippet in SNIPPETS[section]:
        # A traceback names the snippet by its line in the document and shows only its code.
        name = f"<docs/quickstart.md, snippet at line {snippet.line}>"
        lines = snippet.source.splitlines(keepends=True)
        linecache.cache[name] = (len(snippet.source), None, lines, name)
        code = compile(snippet.source, name, "exec")
        exec(code, namespace)
    assert dict(calls) == EXPECTED_CALLS[section]
    # the video's layout reached every MMInference layer (without it they run as all text)
    assert all(isinstance(layout, ModalityLayout) for layout in layouts)
