"""Load a benchmark file of the repo as a module (benchmarks are not packages), for the scripts."""

from __future__ import annotations

import importlib.util
import pathlib
from types import ModuleType

ROOT = pathlib.Path(__file__).resolve().parents[1]


def load_repo_module(name: str, relpath: str) -> ModuleType:
    """The Python file ``ROOT / relpath`` imported as module ``name``."""
    spec = importlib.util.spec_from_file_location(name, ROOT / relpath)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod
