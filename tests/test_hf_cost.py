"""qkvlab.hf.cost on a tiny random Llama: perplexity by hand, records through the store, reuse."""

import math

import pytest
import torch

transformers = pytest.importorskip("transformers")

from qkvlab.experiments.store import Store  # noqa: E402
from qkvlab.hf import cost  # noqa: E402
from qkvlab.hf.cost import CostConfig, measure_tie_cost, nll, summary_rows  # noqa: E402

CFG = CostConfig(seq_len=8, eval_tokens=16, calib_tokens=24, batch=2)


def tiny_llama():
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=50, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                                   max_position_embeddings=64)
    return transformers.LlamaForCausalLM(cfg).eval()


@pytest.fixture
def fake_sources(monkeypatch):
    """A tiny model instead of a GGUF file and random ids instead of Bible text; counts loads."""
    loads = []

    def load(source):
        loads.append(source)
        return tiny_llama(), None

    def ids(tok, split, n, seq_len, translation, skip=0):
        g = torch.Generator().manual_seed({"train": 1, "test": 2}[split] + skip)
        return torch.randint(0, 50, (n // seq_len, seq_len), generator=g)

    monkeypatch.setattr(cost, "load_lm", load)
    monkeypatch.setattr(cost, "bible_ids", ids)
    return loads


def test_nll_is_mean_next_token_loss():
    model, x = tiny_llama().double(), torch.randint(0, 50, (3, 7), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        logp = model(input_ids=x).logits.log_softmax(-1)[:, :-1]
    want = -logp.gather(-1, x[:, 1:, None]).mean()
    assert math.isclose(nll(model, x, batch=2), want.item(), rel_tol=1e-10)


def test_records_go_through_the_store_and_are_reused(fake_sources, tmp_path):
    with Store(tmp_path / "r.db") as store:
        recs = measure_tie_cost(store, "tiny", ("kv", "gqa"), CFG, per_layer=("qk",), log=lambda s: None)
        again = measure_tie_cost(store, "tiny", ("kv", "gqa"), CFG, per_layer=("qk",), log=lambda s: None)
    assert fake_sources == ["tiny"]  # the second call loaded nothing
    assert again == recs
    got = {(r["tie"], r["layers"]): r for r in recs}
    assert set(got) == {("none", "all"), ("kv", "all"), ("gqa", "all"), ("qk", "0"), ("qk", "1")}
    base = tiny_llama()
    ev = cost.bible_ids(None, "test", CFG.eval_tokens, CFG.seq_len, "3")
    assert math.isclose(got["none", "all"]["ppl"], math.exp(nll(base, ev)), rel_tol=1e-6)
    for r in recs:
        assert math.isclose(r["delta_ppl"], r["ppl"] - r["ppl_base"], rel_tol=1e-12)
        assert math.isclose(r["delta_nll"], math.log(r["ppl"] / r["ppl_base"]), rel_tol=1e-9, abs_tol=1e-12)
    assert (got["kv", "all"]["kv_cache"], got["gqa", "all"]["kv_cache"], got["qk", "0"]["kv_cache"]) == (0.5, 0.5, 1.0)
    # attention params per layer: q 32·32, k,v 16·32 each, o 32·32 = 3072; K=V drops v's 512
    assert got["kv", "all"]["attn_params"] == pytest.approx((3072 - 512) / 3072, abs=0)
    rows = summary_rows(recs)
    assert [r["tie"] for r in rows] == ["none", "kv", "gqa", "qk"]
    assert rows[-1]["layers"].startswith("one at a time: median L")


def test_heal_trains_the_tied_attention(fake_sources, tmp_path):
    cfg = CostConfig(seq_len=8, eval_tokens=16, calib_tokens=24, batch=2, heal_steps=2, heal_batch=2)
    with Store(tmp_path / "r.db") as store:
        recs = measure_tie_cost(store, "tiny", ("kv",), cfg, log=lambda s: None)
    healed = [r for r in recs if r["stage"] == "healed"]
    assert len(healed) == 1 and healed[0]["heal_tokens"] == 2 * 2 * 8 and healed[0]["heal_steps"] == 2
    assert healed[0]["ppl"] != [r for r in recs if r["tie"] == "kv" and r["stage"] == "zero-shot"][0]["ppl"]


def test_bad_config_and_kinds_are_named():
    with pytest.raises(ValueError, match="eval_tokens: 10 is not a multiple of seq_len 8"):
        CostConfig(seq_len=8, eval_tokens=10, calib_tokens=8)
    with pytest.raises(ValueError, match="kinds:"):
        measure_tie_cost(None, "tiny", ("alt",), CFG)
