"""qkvlab.hf.basis: a fitted K=V tie's W_O trained in the untied basis (o_basis="untied").

The stand-ins (a tiny random Llama or Qwen2, a BPE and a folder of .py files) are
tests/test_hf_convert.py's, so everything runs offline in seconds.
"""

from __future__ import annotations

import pytest
import torch
from torch.nn.utils import parametrize

from qkvlab.experiments.store import Store
from qkvlab.hf.basis import FoldedOutput, check, fold
from qkvlab.hf.convert import ConvertConfig, convert, load_converted, make_student, token_rows
from qkvlab.hf.tie import calibrate, decoder_layers, fit_kv
from qkvlab.hf.uptrain import UptrainConfig, sequence_nll

transformers = pytest.importorskip("transformers")

from test_hf_convert import make_root, make_tok, small, tiny  # noqa: E402


@pytest.fixture(scope="module")
def text(tmp_path_factory):
    """(tokenizer, root): test_hf_convert's stand-ins for a BPE and the stdlib's source."""
    return make_tok(), make_root(tmp_path_factory.mktemp("pysrc"))


def tiny_qwen(tok, seed=0):
    """A tiny Qwen2: biases on q, k and v (none on o), as in Qwen2.5."""
    from transformers import Qwen2Config, Qwen2ForCausalLM
    torch.manual_seed(seed)
    cfg = Qwen2Config(vocab_size=len(tok), hidden_size=32, intermediate_size=64,
                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                      tie_word_embeddings=True)
    m = Qwen2ForCausalLM(cfg).eval()
    with torch.no_grad():  # large key biases, as Qwen2.5's layers 0-2 have
        for layer in m.model.layers:
            layer.self_attn.k_proj.bias.normal_(0, 30)
    return m


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_the_untied_basis_computes_the_folded_tie_and_trains_the_teachers_w_o(text, family):
    tok, root = text
    teacher = tiny(tok) if family == "llama" else tiny_qwen(tok)
    ids = token_rows(tok, "train", 128, 64, root=root)
    folded = make_student(teacher, small("kv", "fitted"), ids)
    student = make_student(teacher, small("kv", "fitted", o_basis="untied"), ids)
    cal = calibrate(teacher, ids)
    for i, (t, f, s) in enumerate(zip(*(decoder_layers(m) for m in (teacher, folded, student)))):
        o = s.self_attn.o_proj
        assert parametrize.is_parametrized(o, "weight")
        # the trained Parameter is the teacher's W_O itself, M a fixed buffer outside state_dict
        torch.testing.assert_close(o.parametrizations.weight.original, t.self_attn.o_proj.weight,
                                   rtol=0, atol=0)
        assert not any("M" == k.split(".")[-1] for k in s.state_dict())
        # W_O·Mᵀ against a float64 reference of the fold, and against tie()'s folded weight
        M = fit_kv(t.self_attn, cal.moments[i])
        n_heads = t.self_attn.config.num_attention_heads
        W = t.self_attn.o_proj.weight.double().view(-1, n_heads, M.shape[-1])
        ref = torch.einsum("dhe,hfe->dhf", W, M.repeat_interleave(n_heads // M.shape[0], 0))
        torch.testing.assert_close(o.weight.double(), ref.reshape(o.weight.shape),
                                   rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(o.weight, f.self_attn.o_proj.weight, rtol=1e-5, atol=1e-6)
    x = token_rows(tok, "test", 256, 64, root=root)
    assert sequence_nll(student, x) == pytest.approx(sequence_nll(folded, x), rel=1e-5)


def test_a_step_moves_w_o_by_the_rate_in_the_untied_basis(text):
    tok, root = text
    teacher = tiny_qwen(tok)
    ids = token_rows(tok, "train", 128, 64, root=root)
    s = make_student(teacher, small("kv", "fitted", o_basis="untied"), ids)
    o = s.model.layers[0].self_attn.o_proj
    W0 = o.parametrizations.weight.original.detach().clone()
    opt = torch.optim.Adam([o.parametrizations.weight.original], lr=1e-3, eps=1e-30)
    s(input_ids=ids[:2]).logits.square().mean().backward()
    opt.step()  # Adam's first step: every element of the untied W_O moves by the rate
    dW = (o.parametrizations.weight.original.detach() - W0).abs()
    torch.testing.assert_close(dW, torch.full_like(dW, 1e-3), rtol=1e-3, atol=0)


def test_fold_makes_an_ordinary_weight_that_computes_the_same(text):
    tok, root = text
    teacher = tiny_qwen(tok)
    ids = token_rows(tok, "train", 128, 64, root=root)
    s = make_student(teacher, small("kv", "fitted", o_basis="untied"), ids)
    before = [layer.self_attn.o_proj.weight.detach().clone() for layer in s.model.layers]
    fold(s)
    for w, layer in zip(before, s.model.layers):
        o = layer.self_attn.o_proj
        assert not parametrize.is_parametrized(o) and isinstance(o.weight, torch.nn.Parameter)
        torch.testing.assert_close(o.weight, w, rtol=0, atol=0)


def test_a_conversion_in_the_untied_basis_resumes_and_round_trips(text, tmp_path):
    tok, root = text
    m = tiny_qwen(tok)
    cfg = small("kv", "fitted", tokens=256, o_basis="untied")
    with Store(tmp_path / "a.db") as st:
        straight = convert(st, "tiny", cfg, loaded=(m, tok), root=root, log=lambda s: None,
                           progress=False, out=str(tmp_path / "out"))
        spec = st.measure_rows("convert")[0]["spec"]
    with Store(tmp_path / "b.db") as st:
        convert(st, "tiny", small("kv", "fitted", tokens=128, o_basis="untied"), loaded=(m, tok),
                root=root, log=lambda s: None, progress=False)
        resumed = convert(st, "tiny", cfg, loaded=(m, tok), root=root, log=lambda s: None,
                          progress=False)
    assert spec["uptrain"]["o_basis"] == "untied"
    assert resumed[-1]["nll_seq"] == straight[-1]["nll_seq"]  # bit for bit through a checkpoint
    # the tied basis, same start: the same zero-shot model to rounding, another uptraining
    with Store(tmp_path / "c.db") as st:
        tied = convert(st, "tiny", small("kv", "fitted", tokens=256), loaded=(m, tok),
                       root=root, log=lambda s: None, progress=False)
    assert straight[0]["nll"] == pytest.approx(tied[0]["nll"], rel=1e-5)
    assert straight[-1]["nll_seq"] != tied[-1]["nll_seq"]
    model, _ = load_converted(tmp_path / "out")  # written folded: an ordinary K=V model
    for layer in model.model.layers:
        a = layer.self_attn
        assert a.v_proj.weight is a.k_proj.weight and not parametrize.is_parametrized(a.o_proj)
    # scored on the stand-in BPE itself: read back beside a qwen2 config, transformers gives it
    # Qwen2's tokenizer class, which splits the stand-in's text otherwise (a real Qwen2.5
    # tokenizer is that class already)
    ids = token_rows(tok, "test", 256, 64, root=root)
    assert sequence_nll(model, ids) == pytest.approx(straight[-1]["nll_seq"], rel=1e-5)


def test_the_untied_basis_is_refused_where_nothing_was_folded_and_keeps_old_ids():
    for tie_, start in [("none", None), ("qk", None), ("kv", "avg"), ("mqa", None)]:
        with pytest.raises(ValueError, match="o_basis: 'untied' trains the W_O"):
            ConvertConfig(tie=tie_, start=start, uptrain=UptrainConfig(o_basis="untied"))
    with pytest.raises(ValueError, match="o_basis: 'sideways' is not"):
        UptrainConfig(o_basis="sideways")
    with pytest.raises(ValueError, match="o_basis: 'sideways' is not one of"):
        check("kv", "fitted", "sideways")
    assert "o_basis" not in UptrainConfig().to_dict()  # records made before it keep their ids
    assert UptrainConfig(o_basis="untied").to_dict()["o_basis"] == "untied"


def test_folded_output_is_w_o_times_m_transposed_per_head():
    torch.manual_seed(0)
    W, M = torch.randn(6, 2 * 3, dtype=torch.float64), torch.randn(2, 3, 3, dtype=torch.float64)
    got = FoldedOutput(M)(W)
    want = torch.cat([W[:, 3 * h:3 * h + 3] @ M[h].T for h in range(2)], dim=1)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)



def test_the_basis_is_chosen_with_the_rate_on_val_each_basis_its_own_grid(text, tmp_path,
                                                                          monkeypatch):
    import qkvlab.hf.rate as rate
    monkeypatch.setattr(rate, "TOKENS", 256)
    monkeypatch.setattr(rate, "VAL_TOKENS", 128)
    tok, root = text
    kw = {"loaded": (tiny_qwen(tok), tok), "root": root, "log": lambda s: None,
          "progress": False}
    with Store(tmp_path / "a.db") as st:
        recs = convert(st, "tiny", small("kv", "fitted", tokens=256), lr_grid=(1e-5, 3e-3),
                       o_bases=("tied", "untied"), **kw)
        rows = {r["spec"]["uptrain"].get("o_basis", "tied"): r["records"]
                for r in st.measure_rows("convert_lr")}
        run = st.measure_rows("convert")[-1]["spec"]
        # each basis's choice is the stored choice a single-basis grid makes
        for basis, got in rows.items():
            with Store(tmp_path / f"{basis}.db") as one:
                convert(one, "tiny", small("kv", "fitted", tokens=256, o_basis=basis),
                        lr_grid=(1e-5, 3e-3), **kw)
                assert one.measure_rows("convert_lr")[0]["records"] == got
    assert set(rows) == {"tied", "untied"}
    best = {b: min(r["val_nll"] for r in recs_ if not r["diverged"]) for b, recs_ in rows.items()}
    basis = min(best, key=best.get)
    lr = next(r["lr"] for r in rows[basis] if r["chosen"])
    assert run["uptrain"].get("o_basis", "tied") == basis and run["uptrain"]["lr"] == lr
    assert all(r["lr"] == lr for r in recs)


def test_a_basis_list_is_refused_without_a_grid_or_where_the_tie_folds_nothing(text, tmp_path,
                                                                               capsys):
    tok, root = text
    kw = {"loaded": (tiny(tok), tok), "root": root, "log": lambda s: None, "progress": False}
    with Store(tmp_path / "a.db") as st:
        with pytest.raises(ValueError, match="o_bases: the basis is chosen with the rate"):
            convert(st, "tiny", small("kv", "fitted", tokens=256), o_bases=("tied", "untied"),
                    **kw)
        with pytest.raises(ValueError, match="o_basis: 'untied' trains the W_O"):
            convert(st, "tiny", small("kv", "avg", tokens=256), lr_grid=(1e-5,),
                    o_bases=("tied", "untied"), **kw)
        assert st.measure_names() == []  # refused before any candidate trained
    from qkvlab.cli import main
    db = ["--db", str(tmp_path / "s.db")]
    assert main(["convert", "nosuchmodel", *db, "--o-basis", "tied,untied"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--o-basis: a list is a choice made on val with the rate, so it " \
                              "needs --lr-grid" in err[0], err
    with pytest.raises(SystemExit) as e:  # argparse's own refusal, also one line and exit 2
        main(["convert", "nosuchmodel", *db, "--o-basis", "tied,sideways"])
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2 and len(err) == 1 and "name one or more of tied, untied" in err[0]
    assert not (tmp_path / "s.db").exists()
