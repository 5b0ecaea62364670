"""Exit codes and the one error type the CLI turns into a one-line message."""

from __future__ import annotations

EXIT_OK = 0
EXIT_INTERNAL = 1
EXIT_USAGE = 2
EXIT_INPUT = 3  # missing/corrupt video, unsupported model, bad config
EXIT_MEMORY = 4  # does not fit


class CliError(Exception):
    def __init__(self, message: str, code: int = EXIT_INPUT):
        super().__init__(message)
        self.code = code
