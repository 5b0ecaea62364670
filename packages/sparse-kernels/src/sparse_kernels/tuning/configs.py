"""Launch configs and the kernels' candidate lists.

A :class:`LaunchConfig` is what a Triton launch is given beside the arguments: the tile sizes
(constexprs) and the ``num_warps`` / ``num_stages`` options. A :class:`KernelSpec` is one tuned
kernel's contract with the tuning layer: the candidates a tuner may time, the config used under
the interpreter and for fp32 inputs, and which tiles fit a call's block structure.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True)
class LaunchConfig:
    """Tile sizes (``tiles``: constexpr name -> value, sorted) plus the launch options. A kernel
    whose K/V loads are a tuned choice (the triangle's) takes ``TMA=1`` among the tiles of the
    configs that load with the copy engine; its launcher reads that key."""

    tiles: tuple[tuple[str, int], ...]
    num_warps: int = 4
    num_stages: int = 1

    @classmethod
    def of(cls, *, num_warps: int = 4, num_stages: int = 1, **tiles: int) -> LaunchConfig:
        """``LaunchConfig.of(BLOCK_M=128, BLOCK_N=64, num_warps=8, num_stages=3)``."""
        return cls(tuple(sorted(tiles.items())), num_warps, num_stages)

    @classmethod
    def from_json(cls, obj: object, where: str = "config") -> LaunchConfig:
        """Inverse of :meth:`to_json`; every value must be a positive int."""
        if not isinstance(obj, Mapping):
            raise ValueError(f"{where}: expected an object of ints, got {type(obj).__name__}")
        for name, value in obj.items():
            if type(value) is not int or value <= 0:
                raise ValueError(f"{where}.{name}: expected a positive int, got {value!r}")
        for name in ("num_warps", "num_stages"):
            if name not in obj:
                raise ValueError(f"{where}: expected key {name!r}, got keys {sorted(obj)}")
        tiles = {k: v for k, v in obj.items() if k not in ("num_warps", "num_stages")}
        return cls.of(num_warps=obj["num_warps"], num_stages=obj["num_stages"], **tiles)

    def to_json(self) -> dict[str, int]:
        return {**dict(self.tiles), "num_warps": self.num_warps, "num_stages": self.num_stages}

    def __getitem__(self, name: str) -> int:
        for key, value in self.tiles:
            if key == name:
                return value
        raise KeyError(f"{name!r}: this config has tiles {[k for k, _ in self.tiles]}")

    def launch_kwargs(self) -> dict[str, int]:
        """Keyword arguments of ``kernel[grid](...)``: the tiles and the two launch options."""
        return self.to_json()

    def __str__(self) -> str:
        tiles = " ".join(f"{k}={v}" for k, v in self.tiles)
        return f"{tiles} warps={self.num_warps} stages={self.num_stages}".strip()


def _fits_any(config: LaunchConfig, blocks: tuple[int, ...]) -> bool:
    return True


@dataclass(frozen=True)
class KernelSpec:
    """One tuned kernel, as the tuning layer sees it.

    ``name``: the op's key in the tables (``"attention"``, ``"block_sparse"``, ...).
    ``candidates``: what a tuner times, best guess first.
    ``interpreter``: the one config under ``TRITON_INTERPRET=1``.
    ``fp32``: the config for fp32 inputs (exact ``ieee`` dots: large tiles take minutes to
    compile and overflow shared memory), or None to look fp32 up like 16-bit inputs.
    ``fits(config, blocks)``: whether a config can run a call with these block sizes (e.g. tiles
    must divide a mask's blocks); ``fallback(blocks)``: the config when no candidate fits.
    """

    name: str
    candidates: tuple[LaunchConfig, ...]
    interpreter: LaunchConfig
    fp32: LaunchConfig | None = None
    fits: Callable[[LaunchConfig, tuple[int, ...]], bool] = field(default=_fits_any)
    fallback: Callable[[tuple[int, ...]], LaunchConfig] | None = None

    def fitting(self, blocks: tuple[int, ...]) -> list[LaunchConfig]:
        return [c for c in self.candidates if self.fits(c, blocks)]

    def safe(self, blocks: tuple[int, ...]) -> LaunchConfig:
        """The config sure to compile and fit: the fitting candidate with the least shared
        memory (tile area x stages; index loads before ``TMA=1``), else ``fallback(blocks)``."""
        fit = self.fitting(blocks)
        if not fit:
            if self.fallback is None:
                raise ValueError(
                    f"{self.name}: no launch config fits blocks {blocks}; candidates "
                    f"{[str(c) for c in self.candidates]}"
                )
            return self.fallback(blocks)

        def size(c: LaunchConfig) -> tuple[bool, int, int]:
            area = 1
            for k, v in c.tiles:
                if k != "TMA":
                    area *= v
            return any(k == "TMA" for k, _ in c.tiles), area * c.num_stages, c.num_warps

        return min(fit, key=size)
