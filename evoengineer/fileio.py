"""Files written whole or not at all, with the permissions the user's umask gives a new file."""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path
from typing import IO, Iterator


def umask() -> int:
    """The process's umask (read without changing it for longer than the call)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


@contextlib.contextmanager
def atomic_open(path: str | Path, *, newline: str | None = None) -> Iterator[IO[str]]:
    """Write text to a temp file beside `path`, then fsync and rename it over `path` (a crash or an error leaves the
    old file and no temp file). The new file gets mode 0666 less the umask, as `open(path, "w")` would give it."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent if str(path.parent) else ".")
    try:
        os.fchmod(fd, 0o666 & ~umask())
        with os.fdopen(fd, "w", encoding="utf-8", newline=newline) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def write_text_atomic(path: str | Path, text: str) -> None:
    with atomic_open(path) as f:
        f.write(text)

