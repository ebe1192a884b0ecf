"""The prepared-data cache: tokens decode back to the split texts, prepared once, keyed by
content, rebuilt when unfinished, written atomically."""

from __future__ import annotations

import os
import shutil

import numpy as np
import pytest

from qkvlab.data import cache, corpus

WORDS = ["the", "lord", "said", "unto", "moses", "and", "aaron", "speak", "to", "all", "the", "children", "of", "israel"]


def write_text(path, n_lines=400, seed=0):
    rng = np.random.default_rng(seed)
    lines = [" ".join(rng.choice(WORDS, size=rng.integers(3, 12))) + "." for _ in range(n_lines)]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return lines


def write_tsv(path, n=300, seed=0):
    rng = np.random.default_rng(seed)
    pairs = []
    for i in range(n):
        words = list(rng.choice(WORDS, size=rng.integers(2, 8)))
        pairs.append((" ".join(words), " ".join(w[::-1] for w in words) + f" {i}"))
    path.write_text("".join(f"{a}\t{b}\n" for a, b in pairs), encoding="utf-8")
    return pairs


@pytest.mark.parametrize("kind", ["char", "bpe"])
def test_text_tokens_decode_to_the_split_texts(tmp_path, kind):
    src = tmp_path / "book.txt"
    write_text(src)
    data = cache.prepare_text({"text": str(src)}, kind, 300, tmp_path / "c")
    splits = corpus.user_text_splits(src)
    for s in corpus.SPLITS:
        arr = data.tokens[s]
        assert isinstance(arr, np.memmap) and arr.dtype == np.uint16 and not arr.flags.writeable
        assert data.tokenizer.decode(arr.tolist()) == "\n".join(splits[s])
        assert data.meta["tokens"][s] == arr.size
        assert data.meta["chars"][s] == len("\n".join(splits[s]))
    assert data.meta["d_vocab"] == data.tokenizer.vocab_size
    assert not [p for p in data.path.rglob("*") if p.name.endswith(".tmp")]


def test_prepared_once_then_only_loaded(tmp_path, monkeypatch):
    src = tmp_path / "book.txt"
    write_text(src)
    first = cache.prepare_text({"text": str(src)}, "char", cache_dir=tmp_path / "c")

    def no_training(*a, **k):
        raise AssertionError("the cache should have been used")

    monkeypatch.setattr(cache, "train_tokenizer", no_training)
    again = cache.prepare_text({"text": str(src)}, "char", cache_dir=tmp_path / "c")
    assert again.path == first.path and again.meta == first.meta
    for s in corpus.SPLITS:
        np.testing.assert_array_equal(again.tokens[s], first.tokens[s])


def test_key_is_the_content_not_the_path(tmp_path):
    a = tmp_path / "a.txt"
    write_text(a)
    b = tmp_path / "elsewhere" / "a.txt"
    b.parent.mkdir()
    shutil.copy(a, b)
    da = cache.prepare_text({"text": str(a)}, "char", cache_dir=tmp_path / "c")
    db = cache.prepare_text({"text": str(b)}, "char", cache_dir=tmp_path / "c")
    assert da.path == db.path
    write_text(b, seed=1)
    dc = cache.prepare_text({"text": str(b)}, "char", cache_dir=tmp_path / "c")
    assert dc.path != da.path
    dd = cache.prepare_text({"text": str(a)}, "bpe", 300, cache_dir=tmp_path / "c")
    assert dd.path != da.path


def test_unfinished_directory_is_rebuilt(tmp_path):
    src = tmp_path / "book.txt"
    write_text(src)
    first = cache.prepare_text({"text": str(src)}, "char", cache_dir=tmp_path / "c")
    expected = {s: np.array(first.tokens[s]) for s in corpus.SPLITS}
    (first.path / "meta.json").unlink()  # as if killed before the last write
    (first.path / "val.npy").write_bytes(b"truncated")
    again = cache.prepare_text({"text": str(src)}, "char", cache_dir=tmp_path / "c")
    for s in corpus.SPLITS:
        np.testing.assert_array_equal(again.tokens[s], expected[s])


def test_cache_root_order(tmp_path, monkeypatch):
    monkeypatch.setenv("QKVLAB_CACHE", str(tmp_path / "env"))
    assert cache.cache_root() == tmp_path / "env"
    assert cache.cache_root(tmp_path / "arg") == tmp_path / "arg"
    monkeypatch.delenv("QKVLAB_CACHE")
    assert cache.cache_root() == cache.Path.home() / ".cache" / "qkvlab"
    src = tmp_path / "book.txt"
    write_text(src)
    monkeypatch.setenv("QKVLAB_CACHE", str(tmp_path / "env"))
    data = cache.prepare_text({"text": str(src)}, "char")
    assert data.path.parent == tmp_path / "env"


def test_atomic_write_keeps_the_old_file_on_failure(tmp_path, monkeypatch):
    target = tmp_path / "x.npy"
    cache.save_array(target, np.arange(3, dtype=np.uint16))

    def boom(f, arr, **kw):
        f.write(b"half")
        raise OSError("disk full")

    monkeypatch.setattr(cache.np, "save", boom)
    with pytest.raises(OSError, match="disk full"):
        cache.save_array(target, np.arange(5, dtype=np.uint16))
    monkeypatch.undo()
    assert np.load(target).tolist() == [0, 1, 2]
    assert os.listdir(tmp_path) == ["x.npy"]


def test_pairs_decode_to_the_tsv(tmp_path):
    f = tmp_path / "pairs.tsv"
    write_tsv(f)
    data = cache.prepare_pairs({"tsv": str(f)}, "bpe", 300, tmp_path / "c")
    splits = corpus.user_pair_splits(f)
    tok = data.tokenizer
    for s in corpus.SPLITS:
        assert data.meta["pairs"][s] == len(splits[s]) == len(data.src_off[s]) - 1
        got = [(tok.decode(a.tolist()), tok.decode(b.tolist()))
               for a, b in (data.pair(s, i) for i in range(len(splits[s])))]
        assert got == splits[s]
