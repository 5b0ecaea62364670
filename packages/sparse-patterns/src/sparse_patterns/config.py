"""``PatternConfig``: the per-model choice of pattern per (layer, head), as versioned typed JSON.

JSON shape (version 1)::

    {"format": "sparse-patterns/pattern-config", "version": 1, "model_id": "...",
     "num_layers": L, "num_heads": H, "metadata": {...},
     "layers": [[{"pattern": {"kind": "grid", ...}, "boundary": {"kind": "none"}}, ...H], ...L]}

Reading validates everything and raises ``ValueError``/``TypeError`` naming the field, the
expected and the received value (wrong format or version, wrong model, bad fields, a JSON text
nested deeper than :data:`MAX_JSON_DEPTH` or with a key given twice in one object).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .patterns import MAX_INT, HeadConfig, _describe, head_config_from_dict

FORMAT = "sparse-patterns/pattern-config"
VERSION = 1
# The schema nests 5 levels (config, layers, layer, head, pattern); metadata adds a few. The
# limit keeps hostile input from exhausting Python's recursion in the JSON parser.
MAX_JSON_DEPTH = 64

# A JSON string (skipped whole, so brackets inside it do not count) or one bracket.
_JSON_TOKEN = re.compile(r'"(?:[^"\\]|\\.)*"|[\[\]{}]')


def _check_depth(text: str) -> None:
    depth = 0
    for m in _JSON_TOKEN.finditer(text):
        c = m.group()
        if c in "[{":
            depth += 1
            if depth > MAX_JSON_DEPTH:
                raise ValueError(
                    f"PatternConfig: expected JSON nested at most {MAX_JSON_DEPTH} levels deep, "
                    f"got deeper nesting at character {m.start()}"
                )
        elif c in "]}":
            depth -= 1


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    d: dict[str, Any] = {}
    for k, v in pairs:
        if k in d:
            raise ValueError(f"expected each key once per JSON object, got {k!r} twice")
        d[k] = v
    return d


@dataclass(frozen=True)
class PatternConfig:
    """``layers[l][h]`` is the :class:`HeadConfig` of query head ``h`` of layer ``l``.

    ``metadata``: JSON-able facts about how the config was made (search budget, cost model,
    device, calibration length, per-head scores...).
    """

    model_id: str
    num_layers: int
    num_heads: int
    layers: tuple[tuple[HeadConfig, ...], ...]
    metadata: dict[str, Any] = field(default_factory=dict, compare=False)
    version: int = VERSION

    def __post_init__(self) -> None:
        if not isinstance(self.model_id, str) or not self.model_id:
            raise TypeError(f"model_id: expected a non-empty str, got {_describe(self.model_id)}")
        for name in ("num_layers", "num_heads"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int):
                raise TypeError(f"{name}: expected an int, got {_describe(v)}")
            if not 1 <= v <= MAX_INT:
                raise ValueError(f"{name}: expected an int in [1, {MAX_INT}], got {_describe(v)}")
        if self.version != VERSION:
            raise ValueError(f"version: expected {VERSION}, got {_describe(self.version)}")
        if not isinstance(self.metadata, dict):
            raise TypeError(
                f"metadata: expected a dict (a JSON object of facts about the search), "
                f"got {_describe(self.metadata)}"
            )
        if not isinstance(self.layers, (list, tuple)):
            raise TypeError(f"layers: expected a sequence of layers, got {_describe(self.layers)}")
        for li, layer in enumerate(self.layers):
            if not isinstance(layer, (list, tuple)):
                raise TypeError(
                    f"layers[{li}]: expected a sequence of heads, got {_describe(layer)}"
                )
        layers = tuple(tuple(layer) for layer in self.layers)
        object.__setattr__(self, "layers", layers)
        if len(layers) != self.num_layers:
            raise ValueError(f"layers: expected {self.num_layers} layers, got {len(layers)}")
        for li, layer in enumerate(layers):
            if len(layer) != self.num_heads:
                raise ValueError(f"layers[{li}]: expected {self.num_heads} heads, got {len(layer)}")
            for hi, hc in enumerate(layer):
                if not isinstance(hc, HeadConfig):
                    raise TypeError(
                        f"layers[{li}][{hi}]: expected a HeadConfig, got {_describe(hc)}"
                    )

    def layer(self, index: int) -> tuple[HeadConfig, ...]:
        if not 0 <= index < self.num_layers:
            raise IndexError(f"layer: expected 0 <= index < {self.num_layers}, got {index}")
        return self.layers[index]

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "version": self.version,
            "model_id": self.model_id,
            "num_layers": self.num_layers,
            "num_heads": self.num_heads,
            "metadata": self.metadata,
            "layers": [[h.to_dict() for h in layer] for layer in self.layers],
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=1, sort_keys=False)

    @classmethod
    def from_dict(cls, d: object, *, model_id: str | None = None) -> PatternConfig:
        if not isinstance(d, dict):
            raise TypeError(f"PatternConfig: expected a JSON object, got {_describe(d)}")
        if d.get("format") != FORMAT:
            raise ValueError(f"format: expected {FORMAT!r}, got {_describe(d.get('format'))}")
        if type(d.get("version")) is not int or d.get("version") != VERSION:
            raise ValueError(
                f"version: expected {VERSION} (this sparse-patterns reads version {VERSION}), "
                f"got {_describe(d.get('version'))}"
            )
        known = {"format", "version", "model_id", "num_layers", "num_heads", "metadata", "layers"}
        extra = set(d) - known
        if extra:
            raise ValueError(
                f"PatternConfig: unknown fields {sorted(map(str, extra))}; expected {sorted(known)}"
            )
        missing = known - {"metadata"} - set(d)
        if missing:
            raise ValueError(f"PatternConfig: missing fields {sorted(missing)}")
        if model_id is not None and d["model_id"] != model_id:
            raise ValueError(f"model_id: expected {model_id!r}, got {_describe(d['model_id'])}")
        metadata = d.get("metadata", {})
        if not isinstance(metadata, dict):
            raise TypeError(
                f"metadata: expected a JSON object of facts about the search (or no 'metadata' "
                f"field), got {_describe(metadata)}"
            )
        layers = d["layers"]
        if not isinstance(layers, list):
            raise TypeError(f"layers: expected a list, got {_describe(layers)}")
        parsed = []
        for li, layer in enumerate(layers):
            if not isinstance(layer, list):
                raise TypeError(f"layers[{li}]: expected a list, got {_describe(layer)}")
            parsed.append(
                tuple(head_config_from_dict(h, f"layers[{li}][{hi}]") for hi, h in enumerate(layer))
            )
        return cls(
            model_id=d["model_id"],
            num_layers=d["num_layers"],
            num_heads=d["num_heads"],
            layers=tuple(parsed),
            metadata=dict(metadata),
        )

    @classmethod
    def from_json(cls, text: str, *, model_id: str | None = None) -> PatternConfig:
        if not isinstance(text, str):
            raise TypeError(
                f"PatternConfig: expected the JSON text as a str, got {_describe(text)}"
            )
        _check_depth(text)
        try:
            d = json.loads(text, object_pairs_hook=_unique_keys)
        except ValueError as e:
            # JSONDecodeError, a duplicate key, or an integer past Python's digit limit
            raise ValueError(f"PatternConfig: not valid JSON ({e})") from None
        return cls.from_dict(d, model_id=model_id)

    def save(self, path: str | Path) -> None:
        Path(path).write_text(self.to_json() + "\n")

    @classmethod
    def load(cls, path: str | Path, *, model_id: str | None = None) -> PatternConfig:
        return cls.from_json(Path(path).read_text(), model_id=model_id)
