"""Atomic file writes: the one way qkvlab puts a file in place.

A writer fills a fresh temporary file in the destination's directory; the file is then
flushed to disk (``fsync``) and renamed over the destination with ``os.replace``, which is
atomic on POSIX and Windows. Readers therefore see the old file or the new one, never a
half-written one; if the writer raises, the old file is untouched and the temporary file is
removed. Each call gets its own temporary name, so concurrent writers of one path never
share a temp file: the last rename wins and the file is always complete.

The temporary file is created with mode ``0o666`` filtered by the process umask, exactly
as ``open(path, "w")`` creates a new file (``tempfile.mkstemp`` would leave it ``0o600``).

A set of files that belongs together (a report: its page, its tables, its figures) is written
with :func:`atomic_dir`: into a fresh folder beside the destination, which takes the
destination's place only once every file is in it.

This module imports nothing from qkvlab, so any layer may use it.
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

__all__ = ["atomic_path", "atomic_write", "atomic_write_text", "atomic_write_bytes", "atomic_open",
           "atomic_dir", "temp_files"]


_TEMP = re.compile(r"\..+\.[0-9a-f]{12}\.tmp", re.DOTALL)  # what _create_temp names


def _create_temp(path: Path) -> Path:
    """A new, empty, uniquely named file beside ``path``, mode 0o666 & ~umask."""
    for _ in range(100):
        tmp = path.with_name(f".{path.name}.{secrets.token_hex(6)}.tmp")
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        except FileExistsError:
            continue
        os.close(fd)
        return tmp
    raise FileExistsError(f"path: could not create a unique temporary file beside {path}")


def _fsync_dir(directory: Path) -> None:
    """Make the rename itself durable where the platform allows opening a directory."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path to write; on a clean exit it replaces ``path`` atomically.

    The parent directory is created if missing. The caller writes the temporary file by
    name (for libraries that take a file name, like ``safetensors.torch.save_file``); it may
    close, truncate or rewrite it. On exit the file is fsynced and renamed over ``path``; on
    an exception it is removed and ``path`` keeps its old content.

    Raises:
        OSError: the directory cannot be created or written, or the rename fails.
        Whatever the caller's block raises, after removing the temporary file.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = _create_temp(path)
    try:
        yield tmp
        with open(tmp, "rb+") as f:  # the data must be on disk before the name points at it
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if os.path.lexists(tmp):
            os.unlink(tmp)
    _fsync_dir(path.parent)


def atomic_write(path: str | os.PathLike, write: Callable[[Path], Any]) -> Path:
    """Call ``write(tmp_path)`` and move the result onto ``path`` atomically; returns ``path``.

    Raises:
        OSError: as :func:`atomic_path`.
        Whatever ``write`` raises; ``path`` is then unchanged and no temporary file is left.
    """
    with atomic_path(path) as tmp:
        write(tmp)
    return Path(path)


@contextlib.contextmanager
def atomic_open(path: str | os.PathLike, mode: str = "w",
                encoding: str | None = "utf-8") -> Iterator[IO]:
    """``with atomic_open(p, "w") as f: ...``: a file object whose content replaces ``p``
    atomically when the block exits cleanly (``"wb"`` for bytes; ``encoding`` is ignored
    then).

    Raises:
        ValueError: ``mode`` is not ``"w"``, ``"wt"`` or ``"wb"``.
        OSError and whatever the block raises, as :func:`atomic_path`.
    """
    if mode not in ("w", "wt", "wb"):
        raise ValueError(f"mode: {mode!r} is not one of 'w', 'wt', 'wb'")
    kw = {} if "b" in mode else {"encoding": encoding}
    with atomic_path(path) as tmp, open(tmp, mode, **kw) as f:
        yield f


def atomic_write_text(path: str | os.PathLike, text: str, encoding: str = "utf-8") -> Path:
    """Write ``text`` to ``path`` atomically; returns ``path``.

    Raises:
        OSError: as :func:`atomic_path`.
    """
    return atomic_write(path, lambda tmp: tmp.write_text(text, encoding=encoding))


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> Path:
    """Write ``data`` to ``path`` atomically; returns ``path``.

    Raises:
        OSError: as :func:`atomic_path`.
    """
    return atomic_write(path, lambda tmp: tmp.write_bytes(data))


def temp_files(folder: str | os.PathLike, name: str | None = None) -> list[Path]:
    """The temporary files :func:`atomic_path` made in ``folder`` (for the file ``name``, or
    for any) that are still there: a writer killed before its rename leaves one, often empty.
    They are never the file itself; only the one writer of the folder (a run's folder: the
    worker that claimed the run) may remove them."""
    folder = Path(folder)
    if not folder.is_dir():
        return []
    pattern = f".{glob_escape(name)}.*.tmp" if name is not None else ".*.tmp"
    return sorted(p for p in folder.glob(pattern)
                  if _TEMP.fullmatch(p.name) and not p.is_dir())


def glob_escape(name: str) -> str:
    """``name`` with glob's special characters taken literally."""
    return "".join(f"[{c}]" if c in "*?[" else c for c in name)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):
        return True
    return True


def _fsync_tree(folder: Path) -> None:
    for root, _dirs, files in os.walk(folder):
        for name in files:
            with open(Path(root) / name, "rb") as f:
                os.fsync(f.fileno())
        _fsync_dir(Path(root))


@contextlib.contextmanager
def atomic_dir(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a new, empty folder beside ``path`` to fill; on a clean exit it takes ``path``'s
    place, and only then is the folder that was there (if any) removed. On an exception the
    new folder is removed and ``path`` is left as it was.

    POSIX cannot rename a folder over a non-empty one, so the swap is two renames (the old
    folder aside to ``.<name>.<pid>.<hex>.old``, the new one into place); a kill between them
    leaves the old report aside and no ``path``. Folders that a killed writer left beside
    ``path`` (``.<name>.<pid>.<hex>.tmp`` or ``.old``, its process gone) are removed on the
    next successful write.

    Raises:
        OSError: the parent cannot be created or written, or a rename fails (the old folder
            is then put back where it can be).
        Whatever the caller's block raises, after removing the new folder.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    stem = f".{path.name}.{os.getpid()}.{secrets.token_hex(6)}"
    tmp, old = path.with_name(stem + ".tmp"), path.with_name(stem + ".old")
    os.mkdir(tmp)
    try:
        yield tmp
        _fsync_tree(tmp)
        if os.path.lexists(path):
            os.rename(path, old)
            try:
                os.rename(tmp, path)
            except OSError:
                os.rename(old, path)
                raise
        else:
            os.rename(tmp, path)
        _fsync_dir(path.parent)
    finally:
        if os.path.lexists(tmp):
            shutil.rmtree(tmp, ignore_errors=True)
    shutil.rmtree(old, ignore_errors=True)
    for left in path.parent.glob(f".{glob_escape(path.name)}.*.*"):
        parts = left.name[len(path.name) + 2:].split(".")
        if (len(parts) == 3 and parts[0].isdigit() and parts[2] in ("tmp", "old")
                and left.is_dir() and not _pid_alive(int(parts[0]))):
            shutil.rmtree(left, ignore_errors=True)
