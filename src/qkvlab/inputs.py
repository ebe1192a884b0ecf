"""Files from outside: the one error type for a bad one, and the limits checked before allocating.

Every reader of a file qkvlab did not write in this process (checkpoints, pretrained weights in
any format, config folders, run specs, tokenizers, results stores) raises
:class:`InputFileError` (a ``ValueError``) whose message starts with the file's path and says
what is wrong in words; the command line prints it on one line and exits with status 2.

A header is a claim, not a fact: readers check every size, count and offset it states against
hard bounds (:data:`BOUNDS`) and against the file itself before they allocate anything from it,
so a small file cannot ask for gigabytes. What an honest file needs is estimated and refused
above :func:`memory_limit` (16 GiB unless ``QKVLAB_MAX_MEMORY`` or ``--max-memory`` says
otherwise).

This module imports nothing from qkvlab, so every layer may use it.
"""

from __future__ import annotations

import math
import numbers
import os
import sys
import tempfile
import traceback
from typing import Any

__all__ = ["InputFileError", "EnvironmentFailure", "BOUNDS", "bounded_int", "memory_limit",
           "check_memory", "check_finite", "format_bytes", "parse_bytes", "print_error"]


class InputFileError(ValueError):
    """A file given to qkvlab is missing, unreadable, corrupt, unsafe, too large, or not of a
    kind qkvlab reads. ``str(e)`` starts with the file's path; ``e.path`` holds it when known."""

    def __init__(self, message: str, path: str | os.PathLike | None = None):
        super().__init__(message)
        self.path = None if path is None else os.fspath(path)


class EnvironmentFailure(RuntimeError):
    """The machine stopped a command, not its input nor a fault in qkvlab (a disk that is
    full): the message names the cause and the path; the command line prints it as one line,
    exit status 1, with no traceback file (a full disk could not hold one)."""


# Upper bounds on the sizes a header or a config may state, with the reason for each: far above
# every model in use, far below what would exhaust a machine before any other check could run.
BOUNDS: dict[str, tuple[int, str]] = {
    "vocab": (1 << 24, "16.7M tokens: the largest vocabularies in use hold about 256k"),
    "context": (1 << 22,
                "4.2M positions: the longest learned or rotary tables in use hold 128k-1M"),
    "width": (1 << 17, "131,072: the widest published transformers are 16-25k wide"),
    "layers": (1 << 12, "4,096 blocks: the deepest published transformers have about 100-200"),
    "heads": (1 << 14, "16,384 heads per layer: published models have at most a few hundred"),
}
DEFAULT_MEMORY_LIMIT = 16 << 30
MEMORY_ENV = "QKVLAB_MAX_MEMORY"


def bounded_int(value: Any, name: str, where: str, *, lo: int = 1, bound: str | None = None,
                hi: int | None = None) -> int:
    """``value`` as an int if it is an integer (not a bool, not a float) in [lo, hi], where
    ``hi`` is ``BOUNDS[bound]`` when ``bound`` is given.

    Raises:
        InputFileError: ``where: name = value ...`` with the allowed range and, for a bound,
            its reason.
    """
    why = ""
    if bound is not None:
        hi, why = BOUNDS[bound][0], f" ({BOUNDS[bound][1]})"
    if hasattr(value, "item") and getattr(value, "size", 1) == 1:  # numpy scalars, 1-element arrays
        value = value.item()
    ok = isinstance(value, numbers.Integral) and not isinstance(value, bool)
    if ok and value >= lo and (hi is None or value <= hi):
        return int(value)
    top = "" if hi is None else f", at most {hi:,}"
    raise InputFileError(f"{where}: {name} = {_short(value)} must be an integer of at least "
                         f"{lo}{top}{why}", path=where)


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def parse_bytes(text: str) -> int:
    """``"16G"``, ``"512M"``, ``"2.5GB"``, ``"1000000"`` -> bytes (binary units).

    Raises:
        ValueError: not a positive size.
    """
    s = str(text).strip().upper().removesuffix("B").removesuffix("I")
    scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}.get(s[-1:], 1)
    try:
        n = float(s[:-1] if scale != 1 else s) * scale
    except ValueError:
        n = float("nan")
    if not math.isfinite(n) or n <= 0:
        raise ValueError(f"max-memory: {text!r} is not a size such as 16G or 512M")
    return int(n)


def memory_limit() -> int:
    """Bytes a reader may allocate for one input: ``$QKVLAB_MAX_MEMORY`` (``16G``, ``512M``),
    else 16 GiB. ``qkvlab analyze --max-memory`` sets it for one command."""
    text = os.environ.get(MEMORY_ENV)
    return parse_bytes(text) if text else DEFAULT_MEMORY_LIMIT


def format_bytes(n: float) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{int(n)} bytes"


def check_memory(where: str | os.PathLike, need: float, what: str) -> None:
    """Refuse to load ``where`` when ``need`` bytes (an estimate of ``what``) exceed the limit.

    Raises:
        InputFileError: naming the estimate, the limit and how to raise it.
    """
    limit = memory_limit()
    if need > limit:
        raise InputFileError(f"{where}: {what} needs about {format_bytes(need)}, above the "
                             f"memory limit of {format_bytes(limit)}; if the machine has it, "
                             f"raise the limit with --max-memory or ${MEMORY_ENV} (e.g. 64G)",
                             path=where)


def check_finite(where: str | os.PathLike, tensors, what: str = "tensor") -> None:
    """Refuse ``where`` when a tensor of ``tensors`` (``(name, tensor)`` pairs, checked in
    order) holds a NaN or an infinity: a damaged file, not a model to measure.

    Raises:
        InputFileError: naming the first such tensor, how many of its values are NaN and
            infinite, and where the first one is.
    """
    for name, t in tensors:
        if t is None or not t.is_floating_point() or bool(t.isfinite().all()):
            continue
        bad = ~t.isfinite()
        n_nan, first = int(t.isnan().sum()), tuple(int(i) for i in bad.nonzero()[0])
        why = ("the weights are damaged" if what != "activation" else "a weight outside the "
               "attention projections is damaged, or the model overflows float32")
        raise InputFileError(f"{where}: {what} {name} is not finite ({n_nan} NaN and "
                             f"{int(bad.sum()) - n_nan} infinite of {t.numel():,} values, the "
                             f"first at index {list(first)}); {why} (refused)", path=where)


def print_error(prog: str, exc: BaseException, debug: bool = False) -> int:
    """Print ``exc`` for a person and return the exit status: 2 for bad input (any
    ``ValueError``, ``InputFileError`` included), 1 for anything else (an
    ``EnvironmentFailure`` one line too, without a traceback file).

    The message goes on its own line, after any progress bar still drawn on stderr. A
    ``ValueError`` is one line. Anything else is a fault in qkvlab: one line naming it and a
    file holding its traceback, or the traceback itself with ``debug``.
    """
    _close_bars()
    if debug:
        traceback.print_exception(exc, file=sys.stderr)
    if isinstance(exc, (ValueError, EnvironmentFailure)):
        print(f"{prog}: error: {_one_line(str(exc))}", file=sys.stderr)
        return 2 if isinstance(exc, ValueError) else 1
    where = "" if debug else f"; traceback in {_save_traceback(exc)} (--debug prints it)"
    print(f"{prog}: internal error: {type(exc).__name__}: {_one_line(str(exc))}{where}",
          file=sys.stderr)
    return 1


def _one_line(text: str, limit: int = 2000) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _save_traceback(exc: BaseException) -> str:
    try:
        fd, path = tempfile.mkstemp(prefix="qkvlab-traceback-", suffix=".txt")
        with os.fdopen(fd, "w") as f:
            traceback.print_exception(exc, file=f)
        return path
    except OSError:
        return "(could not be written)"


def _close_bars() -> None:
    """Close every tqdm bar still open, so the next line starts at column 0 (a closed bar
    clears its line on a terminal; in a log file it leaves its text, so end that line)."""
    tqdm = sys.modules.get("tqdm")
    bars = list(getattr(tqdm.tqdm, "_instances", ())) if tqdm is not None else []
    for bar in bars:
        try:
            bar.close()
        except Exception:  # noqa: BLE001 (a bar half torn down must not hide the error)
            pass
    try:
        if bars and not sys.stderr.isatty():
            sys.stderr.write("\n")
        sys.stderr.flush()
    except (OSError, ValueError, AttributeError):
        pass
