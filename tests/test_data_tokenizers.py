"""Tokenizers: round trips, fixed special ids, deterministic BPE training, JSON save/load."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from qkvlab.data.tokenizers import (
    SPECIALS,
    UNK,
    BPETokenizer,
    CharTokenizer,
    encode_to_array,
    tokenizer_from_json,
    train_tokenizer,
)

TRAIN = ["In the beginning God created the heaven and the earth.",
         "Au commencement, Dieu créa les cieux et la terre.",
         "EN el principio crió Dios los cielos y la tierra.",
         "And God said, Let there be light: and there was light."] * 20


@pytest.fixture(scope="module")
def bpe() -> BPETokenizer:
    return train_tokenizer("bpe", TRAIN, vocab_size=400)


@pytest.fixture(scope="module")
def char() -> CharTokenizer:
    return train_tokenizer("char", TRAIN)


def test_special_ids_are_fixed(char, bpe):
    assert SPECIALS == ("<pad>", "<unk>", "<bos>", "<eos>", "<mask>")
    assert [bpe.tok.token_to_id(s) for s in SPECIALS] == [0, 1, 2, 3, 4]
    assert char.encode("I") == [len(SPECIALS) + sorted(set("".join(TRAIN)) | {"\n"}).index("I")]
    # specials never come out of decode, whatever they are mixed with
    assert char.decode([2, *char.encode("Dieu"), 3, 0]) == "Dieu"
    assert bpe.decode([2, *bpe.encode("Dieu"), 3, 0]) == "Dieu"


@given(st.text(alphabet=sorted(set("".join(TRAIN))), max_size=200))
@settings(max_examples=50, deadline=None)
def test_char_round_trip(text):
    tok = CharTokenizer.train(TRAIN)
    assert tok.decode(tok.encode(text)) == text
    assert tok.encode_array(text).tolist() == tok.encode(text)


def test_char_unknown_is_unk_and_vocab_counts_specials(char):
    assert char.encode("z") == [UNK]  # 'z' is not in the training text
    assert char.decode(char.encode("zeal")) == "eal"
    assert char.vocab_size == len(SPECIALS) + len(set("".join(TRAIN)) | {"\n"})


@given(st.text(max_size=120))
@settings(max_examples=40, deadline=None)
def test_bpe_round_trip_any_unicode(text):
    # byte-level: any string, even characters never seen in training, comes back exactly
    tok = test_bpe_round_trip_any_unicode.tok
    assert tok.decode(tok.encode(text)) == text


test_bpe_round_trip_any_unicode.tok = train_tokenizer("bpe", TRAIN, vocab_size=400)


def test_bpe_training_is_deterministic_and_learns_merges(bpe):
    again = train_tokenizer("bpe", TRAIN, vocab_size=400)
    assert again.to_json() == bpe.to_json()
    assert len(bpe.encode(TRAIN[0])) < len(TRAIN[0].encode()) / 2  # merges shorten known text
    assert bpe.vocab_size <= 400


@pytest.mark.parametrize("kind", ["char", "bpe"])
def test_json_round_trip_encodes_identically(kind, char, bpe):
    tok = char if kind == "char" else bpe
    back = tokenizer_from_json(tok.to_json())
    assert back.kind == kind and back.vocab_size == tok.vocab_size
    for text in TRAIN[:4] + ["unseen: Ωmega ✓"]:
        assert back.encode(text) == tok.encode(text)
    assert back.to_json() == tok.to_json()


@pytest.mark.parametrize("kind", ["char", "bpe"])
def test_encode_to_array_decodes_to_the_joined_text(kind, char, bpe):
    tok = char if kind == "char" else bpe
    arr = encode_to_array(tok, TRAIN[:4])
    assert arr.dtype == np.uint16
    assert tok.decode(arr.tolist()) == "\n".join(TRAIN[:4])
    if kind == "char":  # BPE may segment a line differently alone than inside the joined text
        assert arr.tolist() == tok.encode("\n".join(TRAIN[:4]))


def test_errors_name_the_field():
    with pytest.raises(ValueError, match=r"tokenizer: 'word' is not one of \['char', 'bpe'\]"):
        train_tokenizer("word", TRAIN)
    with pytest.raises(ValueError, match=r"vocab_size: 100 must be in \(261, 65536\]"):
        train_tokenizer("bpe", TRAIN, vocab_size=100)
    with pytest.raises(ValueError, match=r"my\.json: not a qkvlab char or BPE tokenizer"):
        tokenizer_from_json('{"kind": "char", "specials": ["<pad>"], "chars": []}', "my.json")
    with pytest.raises(ValueError, match=r"tokenizer JSON: not a qkvlab"):
        tokenizer_from_json("not json")
