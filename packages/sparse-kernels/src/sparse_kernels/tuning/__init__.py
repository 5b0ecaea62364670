"""Launch configs chosen from tuned tables instead of autotuning inside a user's first call.

Each Triton kernel's tile sizes, warps and stages are looked up per (GPU family, op, variant,
head dim, dtype, GQA group, length bucket) in tables shipped with the package or written by a
user's own tuning run; see ``docs/cold-start.md``.
"""

from .cases import MODEL_SHAPES, OPS, TuneShape
from .compiles import CompiledVariant, CompileLog
from .configs import KernelSpec, LaunchConfig
from .lookup import TUNE_COMMAND, Choice, ConfigChooser, choose_config, family_of, gpu_family
from .table import (
    ConfigTable,
    TableEntry,
    cache_dir,
    length_bucket,
    shipped_table_path,
    user_table_path,
)
from .tuner import TuneResult, tune

__all__ = [
    "MODEL_SHAPES",
    "OPS",
    "TUNE_COMMAND",
    "Choice",
    "CompileLog",
    "CompiledVariant",
    "ConfigChooser",
    "ConfigTable",
    "KernelSpec",
    "LaunchConfig",
    "TableEntry",
    "TuneResult",
    "TuneShape",
    "cache_dir",
    "choose_config",
    "family_of",
    "gpu_family",
    "length_bucket",
    "shipped_table_path",
    "tune",
    "user_table_path",
]
