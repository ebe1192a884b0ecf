"""The held-out test split: a finished run is scored once on ``test`` (``TrainConfig.test_batches``)
from its own generator, into ``final`` as ``test_<metric>``; nothing is added without it, and
training (history, resume) is the same either way."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import pytest
import torch
from test_data_cache import write_text, write_tsv
from test_train_trainer import TINY, ToyTask, spec

from qkvlab.data import get_task
from qkvlab.data.lm import LM
from qkvlab.data.translate import Translate
from qkvlab.models import ModelConfig
from qkvlab.train import TrainConfig, build_seeded, run_from_spec, train
from qkvlab.train.trainer import EVAL_SEED_OFFSET, TEST_SEED_OFFSET, evaluate

SEEN: list[tuple[str, torch.Tensor]] = []


@dataclass(frozen=True)
class SpyTask(ToyTask):
    """ToyTask that records every evaluation batch it draws, with its split."""

    name: ClassVar[str] = "spy"

    def batch(self, split, batch_size, generator):
        b = super().batch(split, batch_size, generator)
        if split != "train":
            SEEN.append((split, b["idx"]))
        return b


def cfg(**over) -> TrainConfig:
    return TrainConfig(**{**spec(seed=2)["train"], **over})


def toy_model(seed=2):
    return build_seeded(ModelConfig(d_vocab=11, n_ctx=12, **TINY), "decoder", seed)


def test_test_batches_score_the_final_model_on_fresh_test_batches():
    SEEN.clear()
    task, model = SpyTask(), toy_model()
    res = train(model, task, cfg(test_batches=2), progress=False)
    assert res.status == "done"
    assert set(res.final) == {"train_loss", "val_loss", "accuracy", "test_val_loss",
                              "test_accuracy"}
    test = [b for s, b in SEEN if s == "test"]
    val = [b for s, b in SEEN if s == "val"]
    assert len(test) == 2 and len(val) == 2  # two val evaluations (steps 4 and 8), one batch each
    # the test generator is its own: batches drawn from seed + TEST_SEED_OFFSET, not val's
    g = torch.Generator().manual_seed(2 + TEST_SEED_OFFSET)
    for b in test:
        torch.testing.assert_close(b, ToyTask().batch("test", 4, g)["idx"], rtol=0, atol=0)
    assert not torch.equal(test[0], val[-1])
    gv = torch.Generator().manual_seed(2 + EVAL_SEED_OFFSET)
    torch.testing.assert_close(val[-1], ToyTask().batch("val", 4, gv)["idx"], rtol=0, atol=0)
    # and the numbers are the final model's on those batches
    again = evaluate(model, task, cfg(test_batches=2), split="test")
    assert {f"test_{k}": v for k, v in again.items()} == {
        k: v for k, v in res.final.items() if k.startswith("test_")}
    assert res.final["test_val_loss"] != res.final["val_loss"]


def test_no_test_batches_adds_nothing_and_training_is_the_same():
    with_test = run_from_spec(spec(seed=5, test_batches=3), progress=False)
    without = run_from_spec(spec(seed=5), progress=False)
    assert set(without.final) == {"train_loss", "val_loss", "accuracy"}
    assert with_test.history == without.history
    assert {k: v for k, v in with_test.final.items() if not k.startswith("test_")} \
        == without.final


def test_a_diverged_run_has_no_test_metrics():
    res = run_from_spec(spec(lr=1e30, warmup=0, grad_clip=0.0, test_batches=2), progress=False)
    assert res.status == "diverged" and res.final == {}


def test_resumed_run_with_test_batches_equals_uninterrupted(tmp_path):
    full = run_from_spec(spec(seed=1, test_batches=2), progress=False)
    c = cfg(seed=1, test_batches=2, checkpoint_every=3)

    class Kill(Exception):
        pass

    class Stop:
        def after_backward(self, step, model, batch):
            if step == 7:
                raise Kill

    with pytest.raises(Kill):
        train(toy_model(1), ToyTask(), c, run_dir=tmp_path, callback=Stop(), progress=False)
    resumed = run_from_spec({**spec(seed=1), "train": c.to_dict()}, run_dir=tmp_path,
                            progress=False)
    assert resumed.history == full.history and resumed.final == full.final


def test_bad_test_batches_names_the_field():
    with pytest.raises(ValueError, match="train.test_batches"):
        TrainConfig(test_batches=-1)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("text")
    write_text(d / "book.txt", n_lines=600)
    write_tsv(d / "pairs.tsv", n=400)
    return d


def test_lm_test_metrics_come_from_the_test_splits_tokens(files, monkeypatch):
    task = get_task("lm", text=str(files / "book.txt"), seq_len=16)
    task.prepare(files / "cache")
    splits = []
    windows = LM.windows

    def spy(self, split, batch_size, length, generator):
        out = windows(self, split, batch_size, length, generator)
        if split != "train":
            splits.append((split, out))
        return out

    monkeypatch.setattr(LM, "windows", spy)
    c = TrainConfig(steps=3, batch_size=4, eval_batches=1, eval_batch_size=4, test_batches=2,
                    warmup=1, seed=0)
    model = build_seeded(ModelConfig(d_vocab=task.d_vocab, n_ctx=16, d_model=16, n_layers=1,
                                     n_heads=2), "decoder", 0)
    res = train(model, task, c, progress=False)
    assert [s for s, _ in splits] == ["val", "test", "test"]
    stream = task.data.tokens["test"].tolist()
    for _, rows in splits[1:]:  # every test window is a window of the test split's tokens
        for row in rows.tolist():
            assert any(stream[i:i + 17] == row for i in range(len(stream) - 16))
    meta = task.data.meta
    per_char = meta["tokens"]["test"] / meta["chars"]["test"]
    assert res.final["test_bits_per_char"] == pytest.approx(
        res.final["test_bits_per_token"] * per_char, rel=1e-12)
    assert set(res.final) == {"train_loss", "val_loss", "bits_per_token", "bits_per_char",
                              "test_val_loss", "test_bits_per_token", "test_bits_per_char"}


def test_translate_decodes_test_pairs_for_chrf(files, monkeypatch):
    pytest.importorskip("sacrebleu")
    task = get_task("translate", pairs=str(files / "pairs.tsv"), seq_len=32, vocab_size=300,
                    n_decode=4, decode_batch=4)
    task.prepare(files / "cache")
    seen = []
    translate = Translate.translate

    def spy(self, model, split, indices):
        seen.append((split, indices.tolist()))
        return translate(self, model, split, indices)

    monkeypatch.setattr(Translate, "translate", spy)
    c = TrainConfig(steps=2, batch_size=4, eval_batches=1, eval_batch_size=4, test_batches=1,
                    warmup=1, seed=0)
    model = build_seeded(ModelConfig(d_vocab=task.d_vocab, n_ctx=32, d_model=16, n_layers=1,
                                     n_heads=2), "encdec", 0)
    res = train(model, task, c, progress=False)
    assert seen == [("val", task.decode_indices("val").tolist()),
                    ("test", task.decode_indices("test").tolist())]
    assert {"test_chrf", "test_bleu", "test_val_loss", "test_accuracy"} <= set(res.final)
