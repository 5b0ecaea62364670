"""Typed, frozen pattern specs (what a head does) and boundary kinds (how modalities are treated).

Every spec is a frozen dataclass with a ``kind`` tag used by the JSON config; parameters are
validated at construction (``ValueError``/``TypeError`` naming expected vs received).

Semantics of each pattern, at element level before block rounding (the executed mask is the
block-granular superset described in :mod:`sparse_patterns.plan`); ``i`` query position,
``j`` key position, always causal (``j <= i``):

* ``Dense``: every causal key.
* ``AShape(sink, window, exact)``: ``j < sink`` or ``i - j < window``. ``exact=False`` (default)
  rounds the set up to blocks and runs the head in the layer's block-sparse launch;
  ``exact=True`` attends exactly this set (no block rounding) with
  ``sparse_kernels.triangle_attention`` (``last=0``), in a launch of its own for those heads:
  its long key loops run nearer dense efficiency than 64x64 block lists.
* ``TriShape(sink, window, last)``: A-shape, plus the last ``last`` query rows are dense.
* ``VerticalSlash(n_vertical, n_slash, last_q, sink, local)``: MInference's pattern: the top
  ``n_vertical`` key columns and the top ``n_slash`` diagonals (offsets ``i - j``) of the
  approximate attention of the last ``last_q`` queries; the first ``sink`` columns and the
  first ``local`` diagonals are always kept. ``exact_verticals=False`` (default) rounds the
  columns up to key blocks and runs the head in the layer's block-sparse launch;
  ``exact_verticals=True`` attends the columns exactly, MInference's kernel semantics
  (``sparse_kernels.vertical_slash_attention``: slash tiles plus leftover columns), in a
  launch of its own for those heads.
* ``Grid(stride, use_hline, use_vline, use_slash, max_stride, last_q)``: MMInference's grid
  head. With stride ``s`` and phase ``p`` (searched online when ``stride is None``, from the
  stride space = tokens per frame and its divisors, capped at ``max_stride``): vertical lines =
  key columns ``j = p (mod s)``; horizontal lines = query rows ``i = p (mod s)`` attend every key;
  slash lines = pairs with ``i = j (mod s)``. Executed after the grid permutation (rows and
  columns ordered by ``(i - p) mod s``), where each family becomes dense tiles; the diagonal tile
  of the permuted order (Algorithm 5's "last and rightmost block") is always computed.
* ``BlockSparse(top_k | ratio, block)``: per query block, the ``top_k`` (or ``ratio`` of the
  causal) key blocks with the highest pooled score (mean-pooled q and k blocks); the first key
  block and the diagonal block are always kept.
* ``SFFixed(local, vline_stride)``: Sparse Transformer "fixed": ``i // local == j // local`` or
  ``j % vline_stride == vline_stride - 1``.
* ``SFStrided(local, vline_stride)``: Sparse Transformer "strided": ``i - j < local`` or
  ``(i - j) % vline_stride == 0``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar

# Largest value a spec's integer parameter may take: token counts, positions and strides are
# int32 in the kernels' index lists, so anything larger cannot describe a real sequence.
MAX_INT = 2**31 - 1


def _describe(value: object) -> str:
    """``value`` for an error message, short; huge ints by size (their ``str`` may raise)."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 64:
        digits = int(value.bit_length() * 0.30103) + 1
        if digits > 60:
            return f"an int of about {digits} digits"
    text = repr(value)
    return f"{type(value).__name__} {text[:60]}{'...' if len(text) > 60 else ''}"


def _int(name: str, value: object, lo: int = 0) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name}: expected an int, got {_describe(value)}")
    if not lo <= value <= MAX_INT:
        raise ValueError(f"{name}: expected an int in [{lo}, {MAX_INT}], got {_describe(value)}")


def _bool(name: str, value: object) -> None:
    if not isinstance(value, bool):
        raise TypeError(f"{name}: expected a bool, got {_describe(value)}")


class _Spec:
    kind: ClassVar[str]

    def to_dict(self) -> dict[str, Any]:
        d = {"kind": self.kind}
        d.update(dataclasses.asdict(self))  # type: ignore[arg-type]
        return d


@dataclass(frozen=True)
class Dense(_Spec):
    kind: ClassVar[str] = "dense"


@dataclass(frozen=True)
class AShape(_Spec):
    sink: int = 128
    window: int = 4096
    exact: bool = False
    kind: ClassVar[str] = "a_shape"

    def __post_init__(self) -> None:
        _int("AShape.sink", self.sink, 0)
        _int("AShape.window", self.window, 1)
        _bool("AShape.exact", self.exact)


@dataclass(frozen=True)
class TriShape(_Spec):
    sink: int = 128
    window: int = 4096
    last: int = 128
    kind: ClassVar[str] = "tri_shape"

    def __post_init__(self) -> None:
        _int("TriShape.sink", self.sink, 0)
        _int("TriShape.window", self.window, 1)
        _int("TriShape.last", self.last, 0)


@dataclass(frozen=True)
class VerticalSlash(_Spec):
    n_vertical: int = 1000
    n_slash: int = 1024
    last_q: int = 64
    sink: int = 4
    local: int = 64
    exact_verticals: bool = False
    kind: ClassVar[str] = "vertical_slash"

    def __post_init__(self) -> None:
        _int("VerticalSlash.n_vertical", self.n_vertical, 0)
        _int("VerticalSlash.n_slash", self.n_slash, 1)
        _int("VerticalSlash.last_q", self.last_q, 1)
        _int("VerticalSlash.sink", self.sink, 0)
        _int("VerticalSlash.local", self.local, 1)
        _bool("VerticalSlash.exact_verticals", self.exact_verticals)


@dataclass(frozen=True)
class Grid(_Spec):
    stride: int | None = None
    use_hline: bool = False
    use_vline: bool = True
    use_slash: bool = True
    max_stride: int = 1024
    last_q: int = 64
    kind: ClassVar[str] = "grid"

    def __post_init__(self) -> None:
        if self.stride is not None:
            _int("Grid.stride", self.stride, 1)
        for n in ("use_hline", "use_vline", "use_slash"):
            _bool(f"Grid.{n}", getattr(self, n))
        _int("Grid.max_stride", self.max_stride, 1)
        _int("Grid.last_q", self.last_q, 1)


@dataclass(frozen=True)
class BlockSparse(_Spec):
    top_k: int | None = None
    ratio: float | None = None
    block: int = 64
    kind: ClassVar[str] = "block_sparse"

    def __post_init__(self) -> None:
        if (self.top_k is None) == (self.ratio is None):
            raise ValueError(
                f"BlockSparse: expected exactly one of top_k and ratio, got "
                f"top_k={_describe(self.top_k)}, ratio={_describe(self.ratio)}"
            )
        if self.top_k is not None:
            _int("BlockSparse.top_k", self.top_k, 1)
        if self.ratio is not None:
            if isinstance(self.ratio, bool) or not isinstance(self.ratio, (int, float)):
                raise TypeError(f"BlockSparse.ratio: expected a float, got {_describe(self.ratio)}")
            # NaN fails this comparison too
            if not 0.0 < self.ratio <= 1.0:
                raise ValueError(
                    f"BlockSparse.ratio: expected 0 < ratio <= 1, got {_describe(self.ratio)}"
                )
        _int("BlockSparse.block", self.block, 1)


@dataclass(frozen=True)
class SFFixed(_Spec):
    local: int
    vline_stride: int
    kind: ClassVar[str] = "sf_fixed"

    def __post_init__(self) -> None:
        _int("SFFixed.local", self.local, 1)
        _int("SFFixed.vline_stride", self.vline_stride, 1)


@dataclass(frozen=True)
class SFStrided(_Spec):
    local: int
    vline_stride: int
    kind: ClassVar[str] = "sf_strided"

    def __post_init__(self) -> None:
        _int("SFStrided.local", self.local, 1)
        _int("SFStrided.vline_stride", self.vline_stride, 1)


Pattern = Dense | AShape | TriShape | VerticalSlash | Grid | BlockSparse | SFFixed | SFStrided
PATTERN_TYPES: tuple[type, ...] = (
    Dense,
    AShape,
    TriShape,
    VerticalSlash,
    Grid,
    BlockSparse,
    SFFixed,
    SFStrided,
)


# ---------------------------------------------------------------------------------------------
# Boundaries (Section 3.2): how the pattern meets modality boundaries.


@dataclass(frozen=True)
class NoBoundary(_Spec):
    """The intra-modality pattern runs over all rows, original order."""

    kind: ClassVar[str] = "none"


@dataclass(frozen=True)
class KBoundary(_Spec):
    """Keys change behaviour at modality boundaries but the sparse index is continuous along
    queries: executed exactly like :class:`NoBoundary` (no extra cost, paper App. B.1)."""

    kind: ClassVar[str] = "k"


@dataclass(frozen=True)
class QBoundary(_Spec):
    """Algorithm 2/6: queries grouped by modality (row permutation); each modality's sparse
    index is estimated from its own last ``last_q`` queries and extrapolated over all of its
    segments; keys stay in original order."""

    kind: ClassVar[str] = "q"


@dataclass(frozen=True)
class TwoDBoundary(_Spec):
    """Algorithm 3/7: queries and keys grouped by modality; each (query modality, key modality)
    pair gets its own index: the head's pattern for the diagonal pairs, the top
    ``cross_vertical`` key columns (estimated from that query modality's last queries) for the
    cross pairs."""

    cross_vertical: int = 256
    kind: ClassVar[str] = "2d"

    def __post_init__(self) -> None:
        _int("TwoDBoundary.cross_vertical", self.cross_vertical, 0)


Boundary = NoBoundary | KBoundary | QBoundary | TwoDBoundary
BOUNDARY_TYPES: tuple[type, ...] = (NoBoundary, KBoundary, QBoundary, TwoDBoundary)


@dataclass(frozen=True)
class HeadConfig:
    """One head's choice: an intra-modality pattern and a boundary kind."""

    pattern: Pattern
    boundary: Boundary = NoBoundary()

    def __post_init__(self) -> None:
        if not isinstance(self.pattern, PATTERN_TYPES):
            raise TypeError(
                f"HeadConfig.pattern: expected one of {[t.__name__ for t in PATTERN_TYPES]}, "
                f"got {_describe(self.pattern)}"
            )
        if not isinstance(self.boundary, BOUNDARY_TYPES):
            raise TypeError(
                f"HeadConfig.boundary: expected one of {[t.__name__ for t in BOUNDARY_TYPES]}, "
                f"got {_describe(self.boundary)}"
            )

    def to_dict(self) -> dict[str, Any]:
        return {"pattern": self.pattern.to_dict(), "boundary": self.boundary.to_dict()}


def _from_dict(d: object, types: tuple[type, ...], what: str) -> Any:
    if not isinstance(d, dict):
        raise TypeError(f"{what}: expected a JSON object, got {_describe(d)}")
    kinds = {t.kind: t for t in types}
    kind = d.get("kind")
    if not isinstance(kind, str) or kind not in kinds:
        raise ValueError(f"{what}.kind: expected one of {sorted(kinds)}, got {_describe(kind)}")
    cls = kinds[kind]
    fields = {f.name for f in dataclasses.fields(cls)}
    extra = set(d) - fields - {"kind"}
    if extra:
        raise ValueError(
            f"{what} ({kind}): unknown fields {sorted(map(str, extra))}; expected {sorted(fields)}"
        )
    required = {
        f.name
        for f in dataclasses.fields(cls)
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    }
    missing = required - set(d)
    if missing:
        raise ValueError(f"{what} ({kind}): missing fields {sorted(missing)}")
    try:
        return cls(**{k: v for k, v in d.items() if k != "kind"})
    except (TypeError, ValueError) as e:
        # the spec names its own field; the prefix says where in the config it sits
        raise type(e)(f"{what}: {e}") from None


def pattern_from_dict(d: object, what: str = "pattern") -> Pattern:
    return _from_dict(d, PATTERN_TYPES, what)


def boundary_from_dict(d: object, what: str = "boundary") -> Boundary:
    return _from_dict(d, BOUNDARY_TYPES, what)


def head_config_from_dict(d: object, what: str = "head") -> HeadConfig:
    if not isinstance(d, dict):
        raise TypeError(f"{what}: expected a JSON object, got {_describe(d)}")
    extra = set(d) - {"pattern", "boundary"}
    if extra or "pattern" not in d:
        raise ValueError(
            f"{what}: expected keys 'pattern' and optional 'boundary', got {sorted(map(str, d))}"
        )
    return HeadConfig(
        pattern_from_dict(d["pattern"], f"{what}.pattern"),
        boundary_from_dict(d.get("boundary", {"kind": "none"}), f"{what}.boundary"),
    )
