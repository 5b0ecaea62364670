"""`vlm-accel`: long-video VLM prefill with MMInference and TriangleMix.

Commands: run, search, bench, show, probe, demo, tune, warmup (`vlm-accel <command> --help`).
Exit codes: 0 ok, 1 internal error, 2 usage (a flag or its value), 3 bad input (video, model,
config, output path, device), 4 does not fit in memory. Every error is one line on stderr.

Everything that needs no model is checked before the model loads; the config's layer and head
counts right after. torch and transformers are imported only by the commands, so ``--help``
returns at once.
"""

from __future__ import annotations

import sys

from .checks import PROBE_FILE, _prepare
from .errors import EXIT_INPUT, EXIT_INTERNAL, EXIT_USAGE, CliError
from .parser import build_parser

__all__ = ["PROBE_FILE", "build_parser", "main"]


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    try:
        _prepare(args)
        return args.fn(args)
    except CliError as e:
        print(f"vlm-accel: error: {e}", file=sys.stderr)
        return e.code
    except (FileNotFoundError, NotImplementedError) as e:
        print(f"vlm-accel: error: {e}", file=sys.stderr)
        return EXIT_INPUT
    except KeyboardInterrupt:
        return EXIT_USAGE
    except Exception as e:  # noqa: BLE001 - last resort: one line, internal-error code
        print(f"vlm-accel: internal error: {type(e).__name__}: {e}", file=sys.stderr)
        return EXIT_INTERNAL


if __name__ == "__main__":
    sys.exit(main())
