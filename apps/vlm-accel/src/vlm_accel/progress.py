"""What the CLI shows while it works: status lines for the steps without a count (model load,
video decode, first prefill) and tqdm bars for its loops, on stderr, only when stderr is a
terminal."""

from __future__ import annotations

import sys
from collections.abc import Iterable
from typing import IO


def enabled(*, no_progress: bool = False, stream: IO | None = None) -> bool:
    """Bars are drawn unless ``--no-progress`` / ``--quiet`` was given or ``stream`` (default
    stderr) is not a terminal (pipes, files, CI logs)."""
    stream = sys.stderr if stream is None else stream
    isatty = getattr(stream, "isatty", None)
    return not no_progress and callable(isatty) and bool(isatty())


def status(message: str, *, no_progress: bool = False, stream: IO | None = None) -> None:
    """One line ``vlm-accel: <message> ...`` on ``stream`` (default stderr) before a step that
    takes seconds and has nothing to count, drawn as :func:`enabled` says."""
    stream = sys.stderr if stream is None else stream
    if enabled(no_progress=no_progress, stream=stream):
        print(f"vlm-accel: {message} ...", file=stream, flush=True)


def bar(
    iterable: Iterable | None = None,
    *,
    total: int | None = None,
    desc: str,
    unit: str = "it",
    no_progress: bool = False,
    stream: IO | None = None,
):
    """A tqdm bar on ``stream`` (default stderr), disabled as :func:`enabled` says. A disabled
    bar iterates ``iterable`` unchanged and draws nothing."""
    from tqdm import tqdm

    stream = sys.stderr if stream is None else stream
    return tqdm(
        iterable,
        total=total,
        desc=desc,
        unit=unit,
        file=stream,
        disable=not enabled(no_progress=no_progress, stream=stream),
        leave=False,
        dynamic_ncols=True,
    )


class GenerationBar:
    """A ``transformers`` generation streamer that advances a bar by one per generated token
    (the first ``put`` carries the prompt and is skipped)."""

    def __init__(self, max_new_tokens: int, *, no_progress: bool = False, stream: IO | None = None):
        self._bar = bar(
            total=max_new_tokens,
            desc="generate",
            unit="tok",
            no_progress=no_progress,
            stream=stream,
        )
        self._prompt_seen = False

    def put(self, value) -> None:
        if not self._prompt_seen:
            self._prompt_seen = True
            return
        self._bar.update(1)

    def end(self) -> None:
        self._bar.close()
