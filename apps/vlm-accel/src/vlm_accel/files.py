"""Output files of the CLI: checked before any work, written whole or not at all.

Every writer goes through :func:`write_files`: each file is written to a temporary file beside
its destination, given the mode a plain ``open(path, "w")`` would get (0666 less the umask), and
renamed over the destination only after every file of the call was written; on any failure the
temporary files are removed and no destination is touched.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import BinaryIO

from .errors import CliError

Data = bytes | str | Callable[[BinaryIO], None]


def _umask() -> int:
    # The umask can only be read by setting it; set it straight back.
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _nearest_existing(path: Path) -> Path:
    for p in (path, *path.parents):
        if p.exists():
            return p
    return Path(".")


def check_output(path: str | os.PathLike, flag: str) -> Path:
    """``path`` as a Path if a file can be written there; else a CliError naming ``flag``.

    Refused: an existing directory, an existing file that is not writable, a parent that is a
    file, and a directory where no file can be created (read-only, no permission). Missing
    parent directories are fine (they are created when the file is written); the check itself
    creates nothing that outlives it."""
    path = Path(path)
    if path.is_dir():
        raise CliError(f"{flag}: expected a file path, got the directory {path}")
    if path.exists() and not os.access(path, os.W_OK):
        raise CliError(f"{flag}: expected a writable file, got the read-only file {path}")
    base = _nearest_existing(path.parent)
    if not base.is_dir():
        raise CliError(f"{flag}: expected a path under a directory, got {path} ({base} is a file)")
    try:  # permissions, read-only file systems and root all answer the same way to a real file
        fd, probe = tempfile.mkstemp(dir=base, prefix=".vlm-accel-check.")
    except OSError as e:
        raise CliError(
            f"{flag}: expected a writable directory for {path}, got {base} "
            f"({e.strerror or type(e).__name__})"
        ) from None
    os.close(fd)
    os.unlink(probe)
    return path


def write_files(files: Mapping[str | os.PathLike, Data]) -> None:
    """Write every ``path -> data`` (bytes, text, or a function writing to a binary file)
    atomically and together: the destinations change only once every file was written."""
    mode = 0o666 & ~_umask()
    done: list[tuple[str, Path]] = []
    try:
        for path, data in files.items():
            path = Path(path)
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
            done.append((tmp, path))
            with os.fdopen(fd, "wb") as f:
                if callable(data):
                    data(f)
                else:
                    f.write(data.encode() if isinstance(data, str) else data)
            os.chmod(tmp, mode)
        for tmp, path in done:
            os.replace(tmp, path)
    except BaseException:
        for tmp, _ in done:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
        raise


def write_file(path: str | os.PathLike, data: Data) -> None:
    """:func:`write_files` of one file."""
    write_files({path: data})
