"""Tasks on real text (lm, mlm, translate): batches checked against the prepared data by brute
force, determinism, metrics on the real models, pickling, and the Bible corpora."""

from __future__ import annotations

import math
import pickle

import numpy as np
import pytest
import torch
from test_data_cache import write_text, write_tsv
from test_data_corpus import needs_bible

from qkvlab.data import BOS, EOS, IGNORE, MASK, PAD, SPECIALS, corpus, get_task
from qkvlab.models import DecoderLM, Encoder, EncoderDecoder, ModelConfig


def gen(seed):
    return torch.Generator().manual_seed(seed)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("text")
    write_text(d / "book.txt", n_lines=600)
    write_tsv(d / "pairs.tsv", n=400)
    return d


def prepared(name, files, **opts):
    src = {"lm": "text", "mlm": "text", "translate": "pairs"}[name]
    path = files / ("book.txt" if src == "text" else "pairs.tsv")
    task = get_task(name, **{src: str(path)}, **opts)
    task.prepare(files / "cache")
    return task


def tiny(task, seed=0):
    torch.manual_seed(seed)
    cfg = ModelConfig(d_vocab=task.d_vocab, n_ctx=task.seq_len, d_model=32, n_layers=1, n_heads=2)
    return {"decoder": DecoderLM, "encoder": Encoder, "encdec": EncoderDecoder}[task.model_kind](cfg)


def find_row(stream: np.ndarray, row: list[int]) -> int:
    """Start offset of ``row`` in ``stream`` (brute force), -1 if absent."""
    n = len(row)
    for s in range(len(stream) - n + 1):
        if stream[s:s + n].tolist() == row:
            return s
    return -1


@pytest.mark.parametrize("tokenizer", ["char", "bpe"])
def test_lm_batches_are_windows_of_the_split(files, tokenizer):
    task = prepared("lm", files, seq_len=16, tokenizer=tokenizer, vocab_size=300)
    b = task.batch("val", 4, gen(0))
    assert b["idx"].shape == b["targets"].shape == (4, 16) and b["idx"].dtype == torch.long
    torch.testing.assert_close(b["idx"][:, 1:], b["targets"][:, :-1], rtol=0, atol=0)
    stream = np.asarray(task.data.tokens["val"])
    for x, y in zip(b["idx"], b["targets"]):
        assert find_row(stream, x.tolist() + y[-1:].tolist()) >= 0
    again = task.batch("val", 4, gen(0))
    torch.testing.assert_close(again["idx"], b["idx"], rtol=0, atol=0)


def test_lm_metrics(files):
    char = prepared("lm", files, seq_len=16)
    model = tiny(char)
    m = char.evaluate(model, gen(1), n_batches=2, batch_size=4)
    assert set(m) == {"val_loss", "bits_per_token", "bits_per_char"}
    assert m == char.evaluate(model, gen(1), n_batches=2, batch_size=4)
    assert m["bits_per_token"] == pytest.approx(m["val_loss"] / math.log(2))
    assert m["bits_per_char"] == m["bits_per_token"]  # one token per character
    bpe = prepared("lm", files, seq_len=16, tokenizer="bpe", vocab_size=300)
    mb = bpe.evaluate(tiny(bpe), gen(1), n_batches=2, batch_size=4)
    meta = bpe.data.meta
    assert meta["tokens"]["val"] < meta["chars"]["val"]
    assert mb["bits_per_char"] == pytest.approx(
        mb["bits_per_token"] * meta["tokens"]["val"] / meta["chars"]["val"])
    loss = char.loss(model, char.batch("train", 4, gen(2)))
    assert loss.shape == () and torch.isfinite(loss)


def test_mlm_corruption(files):
    task = prepared("mlm", files, seq_len=32, mask_prob=0.3)
    b = task.batch("train", 64, gen(3))
    x = task.windows("train", 64, 32, gen(3))  # the same first draws: the clean windows
    chosen = b["targets"] != IGNORE
    torch.testing.assert_close(b["targets"], torch.where(chosen, x, torch.full_like(x, IGNORE)),
                               rtol=0, atol=0)
    torch.testing.assert_close(b["idx"][~chosen], x[~chosen], rtol=0, atol=0)
    assert bool(chosen.any(1).all())  # every row has a target
    frac = chosen.float().mean().item()
    assert 0.25 < frac < 0.36
    masked = (b["idx"] == MASK)[chosen].float().mean().item()
    assert 0.7 < masked < 0.9
    assert int(b["idx"][chosen & (b["idx"] != MASK)].min()) >= len(SPECIALS)
    model = tiny(task)
    m = task.evaluate(model, gen(4), n_batches=2, batch_size=4)
    assert set(m) == {"val_loss", "accuracy"} and all(isinstance(v, float) for v in m.values())


def test_translate_batch_matches_the_pairs(files):
    task = prepared("translate", files, seq_len=32, vocab_size=300, n_decode=6, decode_batch=4)
    b = task.batch("train", 5, gen(5))
    B, S = b["src"].shape
    T = b["tgt_in"].shape[1]
    # rebuild each row by brute force from the pair it came from
    keep = task.kept["train"]
    pick = torch.randint(0, keep.size, (5,), generator=gen(5)).numpy()
    src = torch.full((B, S), PAD)
    tgt_in = torch.full((B, T), PAD)
    tgt_out = torch.full((B, T), IGNORE)
    for r, i in enumerate(keep[pick]):
        s, t = (a.tolist() for a in task.data.pair("train", int(i)))
        src[r, :len(s) + 1] = torch.tensor(s + [EOS])
        tgt_in[r, :len(t) + 1] = torch.tensor([BOS] + t)
        tgt_out[r, :len(t) + 1] = torch.tensor(t + [EOS])
    expected = {"src": src, "tgt_in": tgt_in, "tgt_out": tgt_out, "src_mask": src != PAD,
                "tgt_mask": tgt_out != IGNORE}
    assert b.keys() == expected.keys()
    for k in b:
        torch.testing.assert_close(b[k], expected[k], rtol=0, atol=0)
    assert max(S, T) == max(int(b["src_mask"].sum(1).max()), int(b["tgt_mask"].sum(1).max()))


def test_translate_metrics_on_a_real_model(files):
    task = prepared("translate", files, seq_len=32, vocab_size=300, n_decode=4, decode_batch=4)
    model = tiny(task)
    loss = task.loss(model, task.batch("train", 4, gen(6)))
    assert loss.shape == () and torch.isfinite(loss)
    m = task.evaluate(model, gen(7), n_batches=2, batch_size=4)
    assert set(m) == {"val_loss", "accuracy", "chrf", "bleu"}
    assert all(isinstance(v, float) and math.isfinite(v) for v in m.values())
    assert m == task.evaluate(model, gen(7), n_batches=2, batch_size=4)
    idx = task.decode_indices()
    assert len(idx) == 4 and len(set(idx.tolist())) == 4
    assert set(idx.tolist()) <= set(task.kept["val"].tolist())


def test_translate_references_score_100(files, monkeypatch):
    """chrF/BLEU are computed against the decoded references: an oracle scores 100."""
    task = prepared("translate", files, seq_len=32, vocab_size=300, n_decode=6)
    refs = [task.data.tokenizer.decode(task.data.pair("val", int(i))[1]) for i in task.decode_indices()]
    monkeypatch.setattr(type(task), "translate", lambda self, model, split, idx: refs)
    assert task.translation_scores(None) == pytest.approx({"chrf": 100.0, "bleu": 100.0}, rel=1e-9)


def test_seq_len_too_long_for_the_text(files):
    with pytest.raises(ValueError, match=r"lm\.seq_len: 100000 is too long for the train split"):
        prepared("lm", files, seq_len=100000)
    with pytest.raises(ValueError, match=r"translate\.seq_len: 2 leaves no train pair"):
        prepared("translate", files, seq_len=2, vocab_size=300)


def test_pickled_task_reloads_from_the_same_cache(files):
    task = prepared("lm", files, seq_len=16)
    blob = pickle.dumps(task)
    assert len(blob) < 2000  # the arrays stay behind
    back = pickle.loads(blob)
    assert back == task and "_data" not in back.__dict__
    torch.testing.assert_close(back.batch("train", 3, gen(8))["idx"],
                               task.batch("train", 3, gen(8))["idx"], rtol=0, atol=0)
    assert back.data.path == task.data.path


@needs_bible
def test_bible_lm_char(tmp_path):
    task = get_task("lm", seq_len=64)
    task.prepare(tmp_path)
    meta = task.data.meta
    assert meta["tokens"] == meta["chars"]  # char-level: one token per character
    assert meta["lines"] == {"train": 56090, "val": 2968, "test": 3146}  # KJV + WEB verses
    chars = set("".join(corpus.bible_text_splits("k4")["train"])) | {"\n"}
    assert task.d_vocab == len(SPECIALS) + len(chars) == 79
    text = task.data.tokenizer.decode(np.asarray(task.data.tokens["train"][:56]).tolist())
    assert text == "In the beginning God created the heaven and the earth.\nA"


@pytest.mark.slow
@needs_bible
@pytest.mark.parametrize("target", ["fr", "es"])
def test_bible_translate(tmp_path, target):
    task = get_task("translate", target=target, n_decode=20)
    task.prepare(tmp_path)
    assert task.data.meta["pairs"] == {"train": 28045, "val": 1484, "test": 1573}
    assert task.d_vocab == 8000
    m = task.evaluate(tiny(task), gen(0), n_batches=1, batch_size=8)
    assert set(m) == {"val_loss", "accuracy", "chrf", "bleu"}


@pytest.mark.parametrize("name", ["lm", "mlm"])
def test_chance_is_the_context_free_loss(files, name):
    """A text task's chance level is the cross-entropy of the best context-free guess, the
    train split's unigram distribution, scored on the train split (a float64 reference)."""
    task = prepared(name, files, seq_len=16)
    tokens = torch.tensor(np.array(task.data.tokens["train"], dtype=np.int64))
    p = torch.bincount(tokens, minlength=task.d_vocab).double() / tokens.numel()
    want = torch.nn.functional.nll_loss(p.clamp_min(1e-300).log()[None].expand(len(tokens), -1),
                                        tokens).item()
    assert task.chance == pytest.approx(want, rel=1e-9, abs=0)
    assert 0 < task.chance < math.log(task.d_vocab)
