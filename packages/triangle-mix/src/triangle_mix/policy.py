"""Which attention each layer runs: dense, dynamic sparse, triangle (or streaming, a baseline)."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Protocol, runtime_checkable

import torch

KINDS = ("dense", "dynamic", "triangle", "streaming")
POLICY_VERSION = 1


@runtime_checkable
class DynamicAttention(Protocol):
    """What a "dynamic" layer calls: a sparse-patterns estimator + kernel, or any callable with
    this signature. ``q [B, H, S_Q, D]``, ``k``/``v`` ``[B, H_KV, S_KV, D]`` (causal, DESIGN.md
    alignment); returns the attention output ``[B, H, S_Q, D]``."""

    def __call__(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, layer_idx: int, scale: float
    ) -> torch.Tensor: ...


@dataclass(frozen=True)
class LayerPolicy:
    """Per-layer attention kinds plus the triangle shape.

    ``kinds[l]`` is ``"dense"``, ``"dynamic"`` (a :class:`DynamicAttention` supplied when the
    policy is applied), ``"triangle"`` (causal, ``j < sink`` or ``i - j < window`` or one of the
    last ``last`` rows) or ``"streaming"`` (the A-shape: triangle without the dense last rows, a
    baseline). ``last_row_only``: the final layer computes only the last query row, for when only
    the next token's logits are wanted (TriangleMix §2.4); the model's outputs at other
    positions are then not meaningful.
    """

    kinds: tuple[str, ...]
    sink: int = 8
    window: int = 512
    last: int = 128
    last_row_only: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.kinds, str) or not isinstance(self.kinds, (tuple, list)):
            raise TypeError(
                f"kinds: expected a tuple or list of kind names, got {type(self.kinds).__name__}"
            )
        if not isinstance(self.kinds, tuple):
            object.__setattr__(self, "kinds", tuple(self.kinds))
        if not self.kinds:
            raise ValueError("kinds: expected one kind per layer, got none")
        bad = [k for k in self.kinds if not isinstance(k, str) or k not in KINDS]
        if bad:
            raise ValueError(f"kinds: expected each of {KINDS}, got {bad[:5]!r}")
        if not isinstance(self.last_row_only, bool):
            raise TypeError(
                f"last_row_only: expected a bool, got {type(self.last_row_only).__name__}"
            )
        for name, lo in (("sink", 0), ("window", 1), ("last", 0)):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < lo:
                raise ValueError(f"{name}: expected an int >= {lo}, got {v!r}")

    # ---- constructors ----------------------------------------------------------------
    @classmethod
    def dense(cls, num_layers: int, **shape) -> LayerPolicy:
        return cls(("dense",) * _n(num_layers), **shape)

    @classmethod
    def triangle_from(
        cls, num_layers: int, start_layer: int, *, shallow: str = "dense", **shape
    ) -> LayerPolicy:
        """TriangleMix: ``shallow`` ("dense" or "dynamic") below ``start_layer``, triangle from it."""
        n = _n(num_layers)
        if isinstance(start_layer, bool) or not isinstance(start_layer, int):
            raise TypeError(f"start_layer: expected an int, got {type(start_layer).__name__}")
        if not 0 <= start_layer <= n:
            raise ValueError(f"start_layer: expected 0..{n}, got {start_layer}")
        if shallow not in ("dense", "dynamic"):
            raise ValueError(f"shallow: expected 'dense' or 'dynamic', got {shallow!r}")
        return cls((shallow,) * start_layer + ("triangle",) * (n - start_layer), **shape)

    @classmethod
    def triangle_everywhere(cls, num_layers: int, **shape) -> LayerPolicy:
        return cls.triangle_from(num_layers, 0, **shape)

    @classmethod
    def streaming_everywhere(cls, num_layers: int, **shape) -> LayerPolicy:
        return cls(("streaming",) * _n(num_layers), **shape)

    # ---- facts -------------------------------------------------------------------------
    @property
    def num_layers(self) -> int:
        return len(self.kinds)

    @property
    def start_layer(self) -> int | None:
        """First triangle layer (None if there is none)."""
        return next((i for i, k in enumerate(self.kinds) if k == "triangle"), None)

    @property
    def needs_dynamic(self) -> bool:
        return "dynamic" in self.kinds

    # ---- JSON ---------------------------------------------------------------------------
    def to_json(self) -> str:
        return json.dumps(
            {"version": POLICY_VERSION, **asdict(self), "kinds": list(self.kinds)}, indent=1
        )

    @classmethod
    def from_json(cls, text: str) -> LayerPolicy:
        if not isinstance(text, str):
            raise TypeError(f"LayerPolicy JSON: expected a str, got {type(text).__name__}")
        try:
            d = json.loads(text)
        except (ValueError, RecursionError) as e:
            # ValueError: bad JSON or an integer past Python's digit limit; RecursionError:
            # nesting deeper than the interpreter's stack
            raise ValueError(
                f"LayerPolicy JSON: not valid JSON ({type(e).__name__}: {e})"
            ) from None
        if not isinstance(d, dict) or d.get("version") != POLICY_VERSION:
            got = d.get("version") if isinstance(d, dict) else type(d).__name__
            raise ValueError(f"LayerPolicy JSON: expected version {POLICY_VERSION}, got {got!r}")
        d.pop("version")
        allowed = {"kinds", "sink", "window", "last", "last_row_only"}
        extra = set(d) - allowed
        if extra:
            raise ValueError(f"LayerPolicy JSON: unknown fields {sorted(extra)}")
        kinds = d.get("kinds", [])
        if not isinstance(kinds, list):
            raise TypeError(f"LayerPolicy JSON: kinds: expected a list, got {type(kinds).__name__}")
        return cls(**{**d, "kinds": tuple(kinds)})


# Far above any model's depth; a larger count would only exhaust memory building the tuple.
MAX_LAYERS = 2**16


def _n(num_layers: int) -> int:
    if isinstance(num_layers, bool) or not isinstance(num_layers, int):
        raise ValueError(f"num_layers: expected an int in [1, {MAX_LAYERS}], got {num_layers!r}")
    if not 1 <= num_layers <= MAX_LAYERS:
        raise ValueError(f"num_layers: expected an int in [1, {MAX_LAYERS}], got {num_layers}")
    return num_layers
