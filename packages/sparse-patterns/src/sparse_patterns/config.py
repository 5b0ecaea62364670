"""``PatternConfig``: the per-model choice of pattern per (layer, head), as versioned typed JSON.

JSON shape (version 1)::

    {"format": "sparse-patterns/pattern-config", "version": 1, "model_id": "...",
     "num_layers": L, "num_heads": H, "metadata": {...},
     "layers": [[{"pattern": {"kind": "grid", ...}, "boundary": {"kind": "none"}}, ...H], ...L]}

Reading validates everything and raises ``ValueError``/``TypeError`` naming the field, the
expected and the received value (wrong format or version, wrong model, bad fields).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .patterns import HeadConfig, head_config_from_dict

FORMAT = "sparse-patterns/pattern-config"
VERSION = 1


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
            raise TypeError(f"model_id: expected a non-empty str, got {self.model_id!r}")
        for name in ("num_layers", "num_heads"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name}: expected an int >= 1, got {v!r}")
        if self.version != VERSION:
            raise ValueError(f"version: expected {VERSION}, got {self.version!r}")
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
                        f"layers[{li}][{hi}]: expected a HeadConfig, got {type(hc).__name__}"
                    )
        if not isinstance(self.metadata, dict):
            raise TypeError(f"metadata: expected a dict, got {type(self.metadata).__name__}")

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
            raise TypeError(f"PatternConfig: expected a JSON object, got {type(d).__name__}")
        if d.get("format") != FORMAT:
            raise ValueError(f"format: expected {FORMAT!r}, got {d.get('format')!r}")
        if d.get("version") != VERSION:
            raise ValueError(
                f"version: expected {VERSION} (this sparse-patterns reads version {VERSION}), "
                f"got {d.get('version')!r}"
            )
        known = {"format", "version", "model_id", "num_layers", "num_heads", "metadata", "layers"}
        extra = set(d) - known
        if extra:
            raise ValueError(f"PatternConfig: unknown fields {sorted(extra)}")
        missing = known - {"metadata"} - set(d)
        if missing:
            raise ValueError(f"PatternConfig: missing fields {sorted(missing)}")
        if model_id is not None and d["model_id"] != model_id:
            raise ValueError(f"model_id: expected {model_id!r}, got {d['model_id']!r}")
        layers = d["layers"]
        if not isinstance(layers, list):
            raise TypeError(f"layers: expected a list, got {type(layers).__name__}")
        parsed = []
        for li, layer in enumerate(layers):
            if not isinstance(layer, list):
                raise TypeError(f"layers[{li}]: expected a list, got {type(layer).__name__}")
            parsed.append(
                tuple(head_config_from_dict(h, f"layers[{li}][{hi}]") for hi, h in enumerate(layer))
            )
        return cls(
            model_id=d["model_id"],
            num_layers=d["num_layers"],
            num_heads=d["num_heads"],
            layers=tuple(parsed),
            metadata=dict(d.get("metadata", {})),
        )

    @classmethod
    def from_json(cls, text: str, *, model_id: str | None = None) -> PatternConfig:
        try:
            d = json.loads(text)
        except json.JSONDecodeError as e:
            raise ValueError(f"PatternConfig: not valid JSON ({e})") from None
        return cls.from_dict(d, model_id=model_id)

    def save(self, path: str | Path) -> None:
        Path(path).write_text(self.to_json() + "\n")

    @classmethod
    def load(cls, path: str | Path, *, model_id: str | None = None) -> PatternConfig:
        return cls.from_json(Path(path).read_text(), model_id=model_id)
