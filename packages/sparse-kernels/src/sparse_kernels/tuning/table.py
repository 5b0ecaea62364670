"""Tuned-config tables: typed, versioned JSON, one file per GPU family.

Shipped tables live in ``sparse_kernels/tuning/tables/<family>.json``; a user's own tuning run
writes ``<cache dir>/tuned-<family>.json`` (see :func:`user_table_path`). Both have this shape::

    {"format": 1, "family": "h100", "gpu": "NVIDIA H100 80GB HBM3", "capability": "9.0",
     "versions": {"torch": "2.11.0", "triton": "3.6.0"}, "date": "2026-11-26",
     "command": "python -m sparse_kernels tune ...",
     "entries": [{"op": "attention", "variant": "causal", "head_dim": 128, "dtype": "bfloat16",
                  "group": 7, "bucket": 9, "seq_len": 131072, "ms": 1.23,
                  "config": {"BLOCK_M": 128, "BLOCK_N": 128, "num_warps": 8, "num_stages": 3}}]}

``bucket`` is :func:`length_bucket` of the key length the entry was timed at; ``capability`` is
the GPU's CUDA compute capability (a GPU with no table of its own may use a table of its
capability: same shared memory and instructions, so every config fits).
"""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from .configs import LaunchConfig

FORMAT = 1
DTYPES = ("float16", "bfloat16", "float32")
SHIPPED_DIR = Path(__file__).resolve().parent / "tables"


def length_bucket(n: int) -> int:
    """Key-length bucket, one per factor of 4: (8K, 32K], (32K, 128K], (128K, 512K] and
    (512K, 2M] are buckets 7, 8, 9 and 10. The best tile can change with length (block-sparse
    attention at 128K on an H100: 34.77 ms with the config best at 32K, 31.17 ms with its own)."""
    return (max(int(n), 1) - 1).bit_length() // 2


@dataclass(frozen=True)
class TableEntry:
    """The best config one tuning run found for one (op, variant, head dim, dtype, GQA group,
    length bucket); ``ms`` is its time at ``seq_len`` keys."""

    op: str
    variant: str
    head_dim: int
    dtype: str
    group: int
    bucket: int
    config: LaunchConfig
    seq_len: int = 0
    ms: float = 0.0

    @property
    def key(self) -> tuple[str, str, int, str, int, int]:
        return (self.op, self.variant, self.head_dim, self.dtype, self.group, self.bucket)

    @classmethod
    def from_json(cls, obj: object, where: str) -> TableEntry:
        if not isinstance(obj, dict):
            raise ValueError(f"{where}: expected an object, got {type(obj).__name__}")
        want = {"op": str, "variant": str, "head_dim": int, "dtype": str, "group": int,
                "bucket": int, "config": dict}  # fmt: skip
        for name, typ in want.items():
            if name not in obj:
                raise ValueError(f"{where}: expected key {name!r}, got keys {sorted(obj)}")
            if type(obj[name]) is not typ:
                raise ValueError(
                    f"{where}.{name}: expected {typ.__name__}, got {type(obj[name]).__name__}"
                )
        if obj["dtype"] not in DTYPES:
            raise ValueError(f"{where}.dtype: expected one of {DTYPES}, got {obj['dtype']!r}")
        for name in ("head_dim", "group"):
            if obj[name] <= 0:
                raise ValueError(f"{where}.{name}: expected a positive int, got {obj[name]}")
        return cls(
            op=obj["op"], variant=obj["variant"], head_dim=obj["head_dim"], dtype=obj["dtype"],
            group=obj["group"], bucket=obj["bucket"],
            config=LaunchConfig.from_json(obj["config"], f"{where}.config"),
            seq_len=int(obj.get("seq_len", 0)), ms=float(obj.get("ms", 0.0)),
        )  # fmt: skip

    def to_json(self) -> dict:
        return {
            "op": self.op, "variant": self.variant, "head_dim": self.head_dim,
            "dtype": self.dtype, "group": self.group, "bucket": self.bucket,
            "seq_len": self.seq_len, "ms": round(self.ms, 4), "config": self.config.to_json(),
        }  # fmt: skip


@dataclass(frozen=True)
class ConfigTable:
    """All tuned entries of one GPU family, with where they came from."""

    family: str
    gpu: str = ""
    capability: str = ""
    versions: dict[str, str] = field(default_factory=dict)
    date: str = ""
    command: str = ""
    entries: tuple[TableEntry, ...] = ()

    @classmethod
    def load(cls, path: str | os.PathLike) -> ConfigTable:
        """Read and validate a table; errors name the file, the field, expected and received."""
        path = Path(path)
        try:
            obj = json.loads(path.read_text())
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}: not valid JSON ({e})") from None
        return cls.from_json(obj, str(path))

    @classmethod
    def from_json(cls, obj: object, where: str = "table") -> ConfigTable:
        if not isinstance(obj, dict):
            raise ValueError(f"{where}: expected a JSON object, got {type(obj).__name__}")
        if obj.get("format") != FORMAT:
            raise ValueError(f"{where}: expected format {FORMAT}, got {obj.get('format')!r}")
        if not isinstance(obj.get("family"), str) or not obj["family"]:
            raise ValueError(
                f"{where}.family: expected a GPU family name, got {obj.get('family')!r}"
            )
        entries = obj.get("entries", [])
        if not isinstance(entries, list):
            raise ValueError(f"{where}.entries: expected a list, got {type(entries).__name__}")
        versions = obj.get("versions", {})
        if not isinstance(versions, dict):
            raise ValueError(f"{where}.versions: expected an object, got {type(versions).__name__}")
        return cls(
            family=obj["family"],
            gpu=str(obj.get("gpu", "")),
            capability=str(obj.get("capability", "")),
            versions={str(k): str(v) for k, v in versions.items()},
            date=str(obj.get("date", "")),
            command=str(obj.get("command", "")),
            entries=tuple(
                TableEntry.from_json(e, f"{where}.entries[{i}]") for i, e in enumerate(entries)
            ),
        )

    def to_json(self) -> dict:
        return {
            "format": FORMAT, "family": self.family, "gpu": self.gpu,
            "capability": self.capability, "versions": self.versions,
            "date": self.date, "command": self.command,
            "entries": [e.to_json() for e in sorted(self.entries, key=lambda e: e.key)],
        }  # fmt: skip

    def save(self, path: str | os.PathLike) -> None:
        """Write atomically (a reader never sees half a table)."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(self.to_json(), indent=1) + "\n")
        os.replace(tmp, path)

    def merged(self, entries: list[TableEntry] | tuple[TableEntry, ...]) -> ConfigTable:
        """This table with ``entries`` added; an entry replaces one with the same key."""
        by_key = {e.key: e for e in self.entries}
        by_key.update({e.key: e for e in entries})
        return dataclasses.replace(self, entries=tuple(by_key.values()))


def cache_dir() -> Path:
    """Where a user's tuning runs write: ``$SPARSE_KERNELS_CACHE_DIR``, else
    ``$XDG_CACHE_HOME/sparse-kernels``, else ``~/.cache/sparse-kernels``."""
    own = os.environ.get("SPARSE_KERNELS_CACHE_DIR")
    if own:
        return Path(own)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "sparse-kernels"


def user_table_path(family: str) -> Path:
    return cache_dir() / f"tuned-{family}.json"


def shipped_table_path(family: str) -> Path:
    return SHIPPED_DIR / f"{family}.json"


def shipped_tables() -> list[ConfigTable]:
    """Every table shipped with the package, by family name."""
    return [ConfigTable.load(p) for p in sorted(SHIPPED_DIR.glob("*.json"))]
