"""The command line's arguments checked before any work: counts, devices, and the paths a
command will write, so a bad one is one line (a ``ValueError``, exit 2) before a model is
loaded, a store opened or a run trained, never a worker that fails forever or an hour of
training whose report cannot be written.

``check_args(command, args)`` (called by ``qkvlab.cli.main`` for every command) reads the
attributes a command has: ``threads``, ``workers``, ``device``, and its outputs as
:data:`OUTPUTS` says (a folder or a file, written or only read). This module imports nothing
from qkvlab, so every layer may use it.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

COUNTS = ("threads", "workers")  # positive integers wherever a command takes them
# command -> (attribute, "folder" | "file", actions that write it (None: every action))
OUTPUTS: dict[str, tuple[tuple[str, str, tuple[str, ...] | None], ...]] = {
    "study": (("out", "folder", None),),
    "analyze": (("out", "folder", None),),
    "results": (("out", "file", None),),
    "bench": (("out", "file", None),),
    "zoo": (("dir", "folder", ("fetch",)),),
    "convert": (("out", "folder", None),),
}


def positive_count(value, name: str) -> int:
    """``value`` if it is an int of at least 1; a ValueError naming ``--name`` otherwise."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"--{name.replace('_', '-')}: {value!r} must be a positive integer")
    return value


def check_device_name(device) -> None:
    """A ``--device`` given on the line must name something: not empty, not blank."""
    if device is not None and not str(device).strip():
        raise ValueError(f"--device: {device!r} names no device; use cpu, cuda or cuda:N "
                         "(or leave --device out)")


def check_output(path, kind: str, name: str, write: bool = True) -> Path:
    """``path`` usable as an output ``kind`` (``folder`` or ``file``): not the other kind,
    under no file, and, when ``write``, in a place this process may write to.

    Raises:
        ValueError: one line naming ``--name``, the path and what is wrong.
    """
    path = Path(path).expanduser()
    flag = f"--{name.replace('_', '-')}"
    if str(path).strip() == "":
        raise ValueError(f"{flag}: an empty path")
    if path.exists():
        if kind == "folder" and not path.is_dir():
            raise ValueError(f"{flag}: {path} is a file, where a folder is expected")
        if kind == "file" and path.is_dir():
            raise ValueError(f"{flag}: {path} is a folder, where a file is expected")
    here = path if path.exists() else path.parent
    while not here.exists() and here != here.parent:  # the nearest part that exists
        here = here.parent
    if here != path and not here.is_dir():
        raise ValueError(f"{flag}: {path} cannot be made: {here} is a file, not a folder")
    if write:  # tried, not asked: os.access lets root "write" /proc, where nothing can be made
        probe = path if path.is_dir() else path.parent if path.exists() else here
        try:
            with tempfile.TemporaryFile(dir=probe):
                pass
        except OSError as e:
            raise ValueError(f"{flag}: {path} cannot be written: a file cannot be made in "
                             f"{probe} ({e.strerror or e})") from None
    return path


def check_args(command: str, args: argparse.Namespace) -> None:
    """Every check above that applies to ``args`` of ``command``; raises the first failure."""
    for name in COUNTS:
        if getattr(args, name, None) is not None:
            positive_count(getattr(args, name), name)
    check_device_name(getattr(args, "device", None))
    for name, kind, actions in OUTPUTS.get(command, ()):
        value = getattr(args, name, None)
        if value is None:
            continue
        write = actions is None or getattr(args, "action", None) in actions
        check_output(value, kind, name, write=write)
