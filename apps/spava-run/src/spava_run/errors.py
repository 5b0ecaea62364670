"""Exit codes and the user-error exception of ``spava-run`` (no heavy imports)."""

from __future__ import annotations

EXIT_OK = 0
EXIT_INTERNAL = 1
EXIT_USAGE = 2
EXIT_INPUT = 3
EXIT_MEMORY = 4


class CliError(Exception):
    """A user mistake: one line on stderr and ``code`` as the exit status."""

    def __init__(self, message: str, code: int = EXIT_INPUT):
        super().__init__(message)
        self.code = code
