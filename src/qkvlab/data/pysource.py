"""Python's standard library source as held-out text for pretrained decoders, offline.

Why this text: the zoo's decoders (SmolLM2, Qwen2.5-Coder, Gemma-3) were trained on web text
*and code*, and a Bible translation is far from either (SmolLM2-135M reads the Bible in Basic
English at ~21 perplexity, the stdlib's source at a few). Debian's ``libpython3.11-stdlib``
puts ~11 MB of Python source (PSF licence) at ``/usr/lib/python3.11`` on every machine of this
project; its docstrings and comments are English technical prose, its code is the kind these
models were trained on. Test suites (``test``/``tests`` folders, much of it generated data)
and installed third-party packages are left out.

Splits are by file, never inside one: a file's path (relative to the root) hashed with sha256
picks its slot, as :mod:`qkvlab.data.corpus` does with chapters: slot 18 of 20 is ``val``, 19
``test``, the rest ``train`` (about 90/5/5). Within a split, files are read in the order of that
hash, a fixed shuffle, joined by a blank line. :func:`fingerprint` hashes every file read, so a
measurement records exactly which text it saw (another Python's stdlib is another text).
"""

from __future__ import annotations

import functools
import hashlib
import os
import sysconfig
from pathlib import Path

from qkvlab.data.corpus import PERIOD, SPLITS, TEST_SLOT, VAL_SLOT

DEBIAN_STDLIB = Path("/usr/lib/python3.11")
SKIP_PARTS = frozenset({"test", "tests", "site-packages", "dist-packages", "__pycache__",
                        "idle_test"})
SEPARATOR = "\n\n"


def default_root() -> Path:
    """``$QKVLAB_PYSOURCE`` if set, else Debian's stdlib, else the running interpreter's."""
    env = os.environ.get("QKVLAB_PYSOURCE")
    if env:
        return Path(env)
    return DEBIAN_STDLIB if DEBIAN_STDLIB.is_dir() else Path(sysconfig.get_paths()["stdlib"])


def _slot(rel: str) -> tuple[int, str]:
    digest = hashlib.sha256(rel.encode()).hexdigest()
    return int(digest, 16) % PERIOD, digest


def source_splits(root: str | None = None) -> dict[str, tuple[tuple[str, str], ...]]:
    """{split: ((relative path, text), ...)} of the ``*.py`` files under ``root`` (default
    :func:`default_root`, resolved on every call).

    Raises:
        FileNotFoundError: ``root`` holds no Python source (names the folder and the fix).
    """
    return _splits(str(Path(root) if root else default_root()))


@functools.lru_cache(maxsize=4)
def _splits(root: str) -> dict[str, tuple[tuple[str, str], ...]]:
    base = Path(root)
    files = sorted(p for p in base.rglob("*.py")
                   if not SKIP_PARTS.intersection(p.relative_to(base).parts[:-1]))
    if not files:
        raise FileNotFoundError(f"{base}: no Python source files; install Debian's "
                                "libpython3.11-stdlib or set QKVLAB_PYSOURCE to a folder of .py "
                                "files")
    out: dict[str, list[tuple[str, str, str]]] = {s: [] for s in SPLITS}
    for p in files:
        rel = p.relative_to(base).as_posix()
        slot, digest = _slot(rel)
        split = "val" if slot == VAL_SLOT else "test" if slot == TEST_SLOT else "train"
        text = p.read_bytes().decode("utf-8", errors="replace")
        out[split].append((digest, rel, text))
    return {s: tuple((rel, text) for _, rel, text in sorted(v)) for s, v in out.items()}


def fingerprint(root: str | None = None) -> str:
    """sha256 over every file's relative path and content, in split order (first 16 hex)."""
    h = hashlib.sha256()
    for split, files in source_splits(root).items():
        for rel, text in files:
            h.update(f"{split}\0{rel}\0".encode())
            h.update(text.encode())
    return h.hexdigest()[:16]


def texts(split: str, root: str | None = None):
    """The split's files' texts in order, each followed by the separator (a generator)."""
    if split not in SPLITS:
        raise ValueError(f"split: {split!r} is not one of {list(SPLITS)}")
    for _, text in source_splits(root)[split]:
        yield text + SEPARATOR


# ---- more training text --------------------------------------------------------------------------
# The stdlib's train split holds ~2.8M SmolLM2 tokens; a GPU uptrains past that in a minute. More
# text for training only (val and test stay the stdlib's, so every curve is scored on the same
# files): every ``*.py`` under another folder (a site-packages, say), test folders left out, in
# the order of the sha256 of each relative path, read lazily.
def more_files(root: str | os.PathLike) -> list[Path]:
    """The ``*.py`` files under ``root`` in reading order (see above).

    Raises:
        FileNotFoundError: ``root`` holds no Python source.
    """
    base = Path(root)
    files = [p for p in base.rglob("*.py")
             if not SKIP_PARTS.intersection(p.relative_to(base).parts[:-1])]
    if not files:
        raise FileNotFoundError(f"{base}: no Python source files for more training text")
    return sorted(files, key=lambda p: _slot(p.relative_to(base).as_posix())[1])


def more_fingerprint(root: str | os.PathLike) -> str:
    """sha256 over each file's relative path and size, in reading order (first 16 hex): reading
    every file of a large tree to name it would cost more than the uptraining reads."""
    base, h = Path(root), hashlib.sha256()
    for p in more_files(base):
        h.update(f"{p.relative_to(base).as_posix()}\0{p.stat().st_size}\0".encode())
    return h.hexdigest()[:16]


def more_texts(root: str | os.PathLike):
    """:func:`more_files`' texts in order, each followed by the separator (a generator)."""
    for p in more_files(root):
        yield p.read_bytes().decode("utf-8", errors="replace") + SEPARATOR
