"""Count and time the Triton kernel variants a piece of work compiles.

Triton compiles one binary per (kernel, constexpr values, argument specialisation) on its first
launch in a process, and keeps it on disk (``~/.triton/cache``, or ``TRITON_CACHE_DIR``): a later
process loads it instead of compiling (milliseconds instead of seconds). :class:`CompileLog`
records each of those first launches, with the time it took, through Triton's
``knobs.runtime.jit_cache_hook`` (called before) and ``jit_post_compile_hook`` (called after).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import triton


@dataclass(frozen=True)
class CompiledVariant:
    """One kernel variant made ready in this process: compiled, or loaded from the disk cache
    (a load takes milliseconds, a compile seconds)."""

    kernel: str
    seconds: float


@dataclass
class CompileLog:
    """``with CompileLog() as log: ...`` records every kernel variant compiled (or loaded from
    Triton's disk cache) inside the block. ``on_compile(kernel_name)`` is called as each one
    starts (a CLI prints a status line with it). Hooks set before the block still run."""

    on_compile: Callable[[str], None] | None = None
    variants: list[CompiledVariant] = field(default_factory=list)

    @property
    def count(self) -> int:
        return len(self.variants)

    @property
    def seconds(self) -> float:
        return sum(v.seconds for v in self.variants)

    def by_kernel(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for v in self.variants:
            out[v.kernel] = out.get(v.kernel, 0) + 1
        return dict(sorted(out.items()))

    def summary(self) -> str:
        return f"{self.count} kernel variants compiled or loaded in {self.seconds:.1f} s"

    def __enter__(self) -> CompileLog:
        rt = _runtime_knobs()
        self._prev = (rt.jit_cache_hook, rt.jit_post_compile_hook)
        self._started: dict[object, float] = {}
        prev_before, prev_after = self._prev

        def before(*args, **kwargs):
            self._started[kwargs.get("key")] = time.perf_counter()
            if self.on_compile is not None:
                self.on_compile(_name(kwargs))
            # a true return value would tell Triton to skip the compile
            return prev_before(*args, **kwargs) if prev_before is not None else False

        def after(*args, **kwargs):
            start = self._started.pop(kwargs.get("key"), None)
            if start is not None:
                self.variants.append(CompiledVariant(_name(kwargs), time.perf_counter() - start))
            return prev_after(*args, **kwargs) if prev_after is not None else None

        rt.jit_cache_hook, rt.jit_post_compile_hook = before, after
        return self

    def __exit__(self, *exc) -> None:
        rt = _runtime_knobs()
        rt.jit_cache_hook, rt.jit_post_compile_hook = self._prev


def _runtime_knobs():
    knobs = getattr(triton, "knobs", None)
    if knobs is None:
        raise NotImplementedError(
            f"CompileLog needs triton.knobs (Triton >= 3.4), got Triton {triton.__version__}"
        )
    return knobs.runtime


def _name(kwargs: dict) -> str:
    fn = kwargs.get("fn")
    return getattr(fn, "name", None) or repr(fn)
