"""Exclusive time per named section of a prefill (attention, estimation, MLP, communication).

``with timer.section("attention"):`` opens a section; a section opened inside another pauses the
outer one, so every moment is counted once, in the innermost open section. Time outside any
section is not counted. On CUDA the boundaries are events on the current stream (kernels run
asynchronously, so host time would measure launches); read :meth:`SectionTimer.seconds` after a
synchronize. On CPU they are ``time.perf_counter`` readings.
"""

from __future__ import annotations

import contextlib
import time

import torch

SECTIONS = ("attention", "estimation", "mlp", "communication")


class SectionTimer:
    """Owned by one prefill; ``seconds()`` gives ``{section: seconds}`` for every name used."""

    def __init__(self, device: torch.device | str = "cpu"):
        self._cuda = torch.device(device).type == "cuda"
        self._stack: list[str] = []
        self._last = None
        self._spans: list[tuple[str, object, object]] = []

    def _mark(self):
        if self._cuda:
            e = torch.cuda.Event(enable_timing=True)
            e.record()
            return e
        return time.perf_counter()

    def _switch(self) -> None:
        now = self._mark()
        if self._stack:
            self._spans.append((self._stack[-1], self._last, now))
        self._last = now

    @contextlib.contextmanager
    def section(self, name: str):
        self._switch()
        self._stack.append(name)
        try:
            yield
        finally:
            self._switch()
            self._stack.pop()

    def enter(self, name: str) -> None:
        """Open ``name`` without a ``with`` block (module hooks); close it with :meth:`exit`."""
        self._switch()
        self._stack.append(name)

    def exit(self, name: str) -> None:
        if not self._stack or self._stack[-1] != name:
            raise RuntimeError(f"SectionTimer: expected {name!r} open innermost, got {self._stack}")
        self._switch()
        self._stack.pop()

    def seconds(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for name, a, b in self._spans:
            dt = a.elapsed_time(b) / 1e3 if self._cuda else b - a
            out[name] = out.get(name, 0.0) + dt
        return out


def section(timer: SectionTimer | None, name: str):
    """``timer.section(name)``, or a no-op without a timer."""
    return contextlib.nullcontext() if timer is None else timer.section(name)
