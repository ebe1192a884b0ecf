"""Character-level and byte-level BPE tokenizers, trained on a training split, stored as JSON.

Both put the same five special tokens first, so every task can rely on their ids:
``<pad>`` 0, ``<unk>`` 1, ``<bos>`` 2, ``<eos>`` 3, ``<mask>`` 4.

- ``char``: one id per character seen in training; an unseen character encodes as ``<unk>``
  (the only lossy case). Bits per token are bits per character.
- ``bpe``: HF ``tokenizers`` byte-level BPE (GPT-2 style), so any string round-trips exactly.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Protocol

import numpy as np

from qkvlab.inputs import InputFileError

SPECIALS = ("<pad>", "<unk>", "<bos>", "<eos>", "<mask>")
PAD, UNK, BOS, EOS, MASK = range(len(SPECIALS))
KINDS = ("char", "bpe")
# Token arrays are stored as uint16 (half the disk and page cache of int32).
MAX_VOCAB = np.iinfo(np.uint16).max + 1


class Tokenizer(Protocol):
    kind: str

    @property
    def vocab_size(self) -> int: ...
    def encode(self, text: str) -> list[int]: ...
    def encode_batch(self, texts: list[str]) -> list[list[int]]: ...
    def decode(self, ids: Iterable[int]) -> str: ...
    def to_json(self) -> str: ...


class CharTokenizer:
    """The sorted characters of the training text (and ``\n``), after the specials."""

    kind = "char"

    def __init__(self, chars: Iterable[str]):
        self.chars = list(chars)
        self.stoi = {c: i + len(SPECIALS) for i, c in enumerate(self.chars)}
        if len(self.stoi) != len(self.chars) or any(len(c) != 1 for c in self.chars):
            raise ValueError("chars: must be distinct single characters")

    @classmethod
    def train(cls, texts: Iterable[str]) -> CharTokenizer:
        seen: set[str] = {"\n"}  # the separator of lines and verses, even when no text holds one
        for t in texts:
            seen.update(t)
        return cls(sorted(seen))

    @property
    def vocab_size(self) -> int:
        return len(SPECIALS) + len(self.chars)

    def encode(self, text: str) -> list[int]:
        get = self.stoi.get
        return [get(c, UNK) for c in text]

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        return [self.encode(t) for t in texts]

    def encode_array(self, text: str) -> np.ndarray:
        """(len(text),) uint16 ids, vectorised through a code-point lookup table."""
        codes = np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32)
        top = max((ord(c) for c in self.chars), default=0)
        table = np.full(max(top, int(codes.max(initial=0))) + 1, UNK, dtype=np.uint16)
        for c, i in self.stoi.items():
            table[ord(c)] = i
        return table[codes]

    def decode(self, ids: Iterable[int]) -> str:
        n = len(SPECIALS)
        return "".join(self.chars[i - n] for i in map(int, ids) if i >= n)

    def to_json(self) -> str:
        return json.dumps({"kind": "char", "specials": list(SPECIALS), "chars": self.chars},
                          ensure_ascii=False)


class BPETokenizer:
    """Byte-level BPE from HF ``tokenizers``; ``vocab_size`` includes the 256 byte symbols."""

    kind = "bpe"

    def __init__(self, tok):
        self.tok = tok

    @classmethod
    def train(cls, texts: Iterable[str], vocab_size: int) -> BPETokenizer:
        # lazy here and below: optional extra [data]; character-level tasks need no tokenizers
        from tokenizers import Tokenizer as HFTokenizer
        from tokenizers import decoders, models, pre_tokenizers, trainers

        if not len(SPECIALS) + 256 < vocab_size <= MAX_VOCAB:
            raise ValueError(f"vocab_size: {vocab_size} must be in "
                             f"({len(SPECIALS) + 256}, {MAX_VOCAB}] for byte-level BPE")
        tok = HFTokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(SPECIALS),
                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                      show_progress=False)
        tok.train_from_iterator(texts, trainer)
        return cls(tok)

    @property
    def vocab_size(self) -> int:
        return self.tok.get_vocab_size()

    def encode(self, text: str) -> list[int]:
        return self.tok.encode(text, add_special_tokens=False).ids

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        return [e.ids for e in self.tok.encode_batch(texts, add_special_tokens=False)]

    def decode(self, ids: Iterable[int]) -> str:
        return self.tok.decode([int(i) for i in ids], skip_special_tokens=True)

    def to_json(self) -> str:
        return self.tok.to_str()


def train_tokenizer(kind: str, texts: list[str], vocab_size: int = 4096) -> Tokenizer:
    """A ``char`` or ``bpe`` tokenizer trained on ``texts`` (the training split only)."""
    if kind == "char":
        return CharTokenizer.train(texts)
    if kind == "bpe":
        return BPETokenizer.train(texts, vocab_size)
    raise ValueError(f"tokenizer: {kind!r} is not one of {list(KINDS)}")


def tokenizer_from_json(text: str, source: str = "tokenizer JSON") -> Tokenizer:
    """Rebuild a tokenizer from ``to_json()`` output; ``InputFileError`` (a ``ValueError``)
    naming ``source`` if malformed."""
    try:
        d = json.loads(text)
        if d.get("kind") == "char":
            if d.get("specials") != list(SPECIALS):
                raise ValueError(f"specials {d.get('specials')} != {list(SPECIALS)}")
            return CharTokenizer(d["chars"])
        from tokenizers import Tokenizer as HFTokenizer

        tok = BPETokenizer(HFTokenizer.from_str(text))
        if [tok.tok.token_to_id(s) for s in SPECIALS] != list(range(len(SPECIALS))):
            raise ValueError("special tokens are not ids 0..4")
        return tok
    except Exception as e:  # noqa: BLE001 (json, KeyError, and the Rust-side errors of tokenizers)
        raise InputFileError(f"{source}: not a qkvlab char or BPE tokenizer ({e})",
                             path=source) from None


def load_tokenizer(path: str | Path) -> Tokenizer:
    """The tokenizer saved at ``path``; ``InputFileError`` naming it if missing or malformed."""
    path = Path(path)
    if not path.is_file():
        raise InputFileError(f"tokenizer: {path} does not exist", path=path)
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise InputFileError(f"{path}: not a qkvlab char or BPE tokenizer (not UTF-8: {e})",
                             path=path) from None
    return tokenizer_from_json(text, str(path))


def encode_to_array(tok: Tokenizer, texts: list[str], sep: str = "\n") -> np.ndarray:
    """Encode ``sep.join(texts)`` as one (N,) uint16 stream.

    BPE encodes text by text (parallel in Rust) and joins with the ids of ``sep``; byte-level
    decoding concatenates bytes, so the stream still decodes back to exactly the joined text.
    """
    if isinstance(tok, CharTokenizer):
        return tok.encode_array(sep.join(texts))
    sep_ids = tok.encode(sep)
    parts: list[int] = []
    for i, ids in enumerate(tok.encode_batch(texts)):
        if i:
            parts.extend(sep_ids)
        parts.extend(ids)
    return np.asarray(parts, dtype=np.uint16)
