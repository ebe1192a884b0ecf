"""qkvlab.hf.convert / uptrain: starts, the chunked distillation loss, resume, save/load, errors.

A tiny random Llama, a byte-level BPE trained here on the test's own text, and a folder of
``.py`` files stand in for SmolLM2 and the stdlib, so every test runs offline in seconds.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch import nn

from qkvlab.experiments.store import Store
from qkvlab.hf.convert import (ConvertConfig, budgets, convert, gap_ci, load_converted, parse_tie,
                               token_rows)
from qkvlab.hf.tie import TieError, tie
from qkvlab.hf.uptrain import UptrainConfig, distill_loss, sequence_nll

transformers = pytest.importorskip("transformers")

SOURCE = '''"""Module {i}: a small file of Python for the tests."""

def add_{i}(a, b):
    """Return the sum of a and b."""
    return a + b  # {i}


class Thing{i}:
    def __init__(self, value):
        self.value = value * {i}
'''


def make_root(d):
    """A folder of 400 small .py files: a stand-in for the stdlib."""
    for i in range(400):
        (d / f"mod_{i:03d}.py").write_text(SOURCE.format(i=i))
    return str(d)


def make_tok():
    """A byte-level BPE of 300 tokens trained on the stand-in source."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast
    t = Tokenizer(models.BPE())
    t.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    t.train_from_iterator([SOURCE.format(i=i) for i in range(50)],
                          trainers.BpeTrainer(vocab_size=300, show_progress=False,
                                              initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    return PreTrainedTokenizerFast(tokenizer_object=t)


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return make_root(tmp_path_factory.mktemp("pysrc"))


@pytest.fixture(scope="module")
def tok(root):
    return make_tok()


def tiny(tok, seed=0, **kw):
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64,
                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                      head_dim=8, tie_word_embeddings=True, **kw)
    return LlamaForCausalLM(cfg).eval()


def small(tie_="kv", start=None, tokens=1024, **up):
    u = UptrainConfig(**{"batch": 2, "seq_len": 64, "precision": "fp32", "warmup": 2,
                         "lr": 1e-3, "chunk": 48, **up})
    return ConvertConfig(tie=tie_, start=start, tokens=tokens, eval_tokens=256,
                         calib_tokens=128, uptrain=u)


@pytest.mark.parametrize("start", ["avg", "keep_k", "keep_v"])
def test_naive_kv_starts_share_one_projection(tok, start):
    m = tiny(tok)
    before = [(a.k_proj.weight.detach().clone(), a.v_proj.weight.detach().clone(),
               a.o_proj.weight.detach().clone())
              for a in (layer.self_attn for layer in m.model.layers)]
    tie(m, "kv", start=start)
    for (k, v, o), layer in zip(before, m.model.layers):
        a = layer.self_attn
        want = {"avg": (k.double() + v.double()) / 2, "keep_k": k.double(),
                "keep_v": v.double()}[start]
        assert a.v_proj.weight is a.k_proj.weight
        torch.testing.assert_close(a.k_proj.weight.double(), want, rtol=1e-6, atol=1e-7)
        torch.testing.assert_close(a.o_proj.weight, o, rtol=0, atol=0)  # W_O untouched


def test_tie_refuses_a_start_of_another_tie(tok):
    with pytest.raises(TieError, match="start: 'avg' is not a start of tie 'qk'"):
        tie(tiny(tok), "qk", start="avg")


def _reference_loss(student, teacher, x, alpha, temp):
    """The loss from whole float64 logits: what the chunked loss must equal."""
    zs = student(input_ids=x).logits[:, :-1].double().flatten(0, 1)
    with torch.no_grad():
        zt = teacher(input_ids=x).logits[:, :-1].double().flatten(0, 1)
    y = x[:, 1:].flatten()
    ce = nn.functional.cross_entropy(zs, y)
    kl = (nn.functional.softmax(zt / temp, -1) * (nn.functional.log_softmax(zt / temp, -1)
                                                  - nn.functional.log_softmax(zs / temp, -1)))
    return alpha * temp ** 2 * kl.sum(-1).mean() + (1 - alpha) * ce


@pytest.mark.parametrize("alpha", [0.0, 0.5, 1.0])
def test_chunked_distill_loss_and_grads_equal_the_whole_logits(tok, alpha):
    import contextlib
    teacher, student = tiny(tok, 0).double(), tiny(tok, 1).double()
    x = torch.randint(0, len(tok), (3, 40))
    cfg = UptrainConfig(alpha=alpha, temperature=2.0, chunk=17, precision="fp32")
    got = distill_loss(student, teacher, x, cfg, contextlib.nullcontext)
    got.backward()
    g_got = {n: p.grad.clone() for n, p in student.named_parameters()}
    student.zero_grad()
    want = _reference_loss(student, teacher, x, alpha, 2.0)
    want.backward()
    torch.testing.assert_close(got.double(), want, rtol=1e-6, atol=1e-9)
    for n, p in student.named_parameters():
        torch.testing.assert_close(g_got[n], p.grad, rtol=1e-5, atol=1e-9, msg=n)


def test_a_bf16_output_layer_trains_the_same_loss_to_bf16_precision(tok):
    """``head="bf16"``: the output layer's matmuls in bf16 (fp32 logits), the rest as before;
    the loss and every gradient agree with the float64 reference to bf16's precision, and the
    config's dict leaves ``head`` out at its default (so earlier records keep their ids)."""
    import contextlib
    teacher, student = tiny(tok, 0).double(), tiny(tok, 1).double()
    x = torch.randint(0, len(tok), (3, 40))
    cfg = UptrainConfig(alpha=0.5, temperature=2.0, chunk=17, precision="fp32", head="bf16")
    got = distill_loss(student, teacher, x, cfg, contextlib.nullcontext)
    got.backward()
    g_got = {n: p.grad.clone() for n, p in student.named_parameters()}
    student.zero_grad()
    want = _reference_loss(student, teacher, x, 0.5, 2.0)
    want.backward()
    assert got.item() != pytest.approx(want.item(), rel=1e-6)  # bf16 rounding did happen
    torch.testing.assert_close(got.double(), want, rtol=2e-2, atol=1e-4)
    for n, p in student.named_parameters():
        cos = nn.functional.cosine_similarity(g_got[n].flatten(), p.grad.flatten(), dim=0)
        assert cos > 0.99, n
    assert "head" not in UptrainConfig().to_dict() and cfg.to_dict()["head"] == "bf16"
    with pytest.raises(ValueError, match="head: 'fp16' is not 'fp32' or 'bf16'"):
        UptrainConfig(head="fp16")


def test_sequence_nll_sums_each_rows_loss(tok):
    m = tiny(tok)
    x = torch.randint(0, len(tok), (3, 20))
    got = torch.tensor(sequence_nll(m, x, batch=2), dtype=torch.float64)
    logits = m(input_ids=x).logits[:, :-1].double()
    want = nn.functional.cross_entropy(logits.transpose(1, 2), x[:, 1:], reduction="none").sum(1)
    torch.testing.assert_close(got, want.detach(), rtol=1e-5, atol=1e-5)


def test_gap_ci_is_the_per_token_ratio_with_a_paired_interval():
    rng = np.random.default_rng(0)
    base = rng.normal(100, 5, 64)
    seq = base + rng.normal(2, 0.5, 64)
    gap, lo, hi = gap_ci(list(seq), list(base), 50)
    assert gap == pytest.approx(math.expm1((seq.mean() - base.mean()) / 50), rel=1e-12)
    assert lo < gap < hi and lo > 0  # every sequence is worse: the paired CI excludes 0
    with pytest.raises(ValueError, match="paired"):
        gap_ci([1.0, 2.0], [1.0], 10)


def test_budgets_are_nested_powers_of_four_from_16k():
    cfg = ConvertConfig(tokens=262144)  # 1024 tokens a step
    assert budgets(cfg) == [0, 16, 64, 256]
    assert budgets(small(tokens=1024)) == [0, 8]


def test_parse_tie_and_bad_configs():
    assert parse_tie("mqa") == ("gqa", 1) and parse_tie("gqa:3") == ("gqa", 3)
    for bad, msg in [({"tie": "vk"}, "tie: 'vk' is not one of"),
                     ({"tie": "kv", "start": "mean_pool"}, "start: 'mean_pool'"),
                     ({"tokens": 10}, "less than one batch")]:
        with pytest.raises(ValueError, match=msg):
            ConvertConfig(**bad)


def test_convert_records_resume_and_round_trip(tok, root, tmp_path):
    m = tiny(tok)
    # straight to 2 steps ...
    with Store(tmp_path / "a.db") as st:
        straight = convert(st, "tiny", small(tokens=256), loaded=(m, tok), root=root,
                           log=lambda s: None, progress=False, out=str(tmp_path / "out"))
    # ... and the same run in two calls (1 step, then a larger budget resumes its checkpoint)
    with Store(tmp_path / "b.db") as st:
        convert(st, "tiny", small(tokens=128), loaded=(m, tok), root=root, log=lambda s: None,
                progress=False)
        logs = []
        resumed = convert(st, "tiny", small(tokens=256), loaded=(m, tok), root=root,
                          log=logs.append, progress=False)
    assert any("resumed at step 1" in s for s in logs)
    assert [r["tokens"] for r in straight] == [0, 256]
    assert resumed[-1]["nll_seq"] == straight[-1]["nll_seq"]  # the same weights, bit for bit
    assert straight[0]["kv_cache"] == 0.5 and straight[0]["gap"] == pytest.approx(
        math.expm1(straight[0]["nll"] - math.log(straight[0]["ppl_teacher"])), rel=1e-9)
    # the written model loads back with K=V shared and scores what the record says
    model, tok2 = load_converted(tmp_path / "out")
    for layer in model.model.layers:
        assert layer.self_attn.v_proj.weight is layer.self_attn.k_proj.weight
    ids = token_rows(tok2, "test", 256, 64, root=root)
    assert sequence_nll(model, ids) == pytest.approx(straight[-1]["nll_seq"], rel=1e-5)


@pytest.mark.parametrize("tie_,start", [("none", None), ("mqa", None), ("qk", None),
                                        ("kv", "fitted")])
def test_convert_every_tie_scores_zero_shot_first(tok, root, tmp_path, tie_, start):
    m = tiny(tok)
    with Store(tmp_path / "s.db") as st:
        recs = convert(st, "tiny", small(tie_, start, tokens=128), loaded=(m, tok), root=root,
                       log=lambda s: None, progress=False)
    assert [r["steps"] for r in recs] == [0, 1]
    if tie_ == "none":  # the untied model at 0 tokens is the teacher itself
        assert recs[0]["gap"] == 0 and recs[0]["kv_cache"] == 1
    assert all(np.isfinite(r["gap"]) for r in recs)


def test_convert_refuses_a_text_too_short_and_a_tie_the_model_cannot_take(tok, root, tmp_path):
    m = tiny(tok)
    with Store(tmp_path / "s.db") as st:
        with pytest.raises(ValueError, match="the test split of the Python source holds"):
            convert(st, "tiny", ConvertConfig(tokens=1024, eval_tokens=2 ** 20,
                                              uptrain=UptrainConfig(precision="fp32")),
                    loaded=(m, tok), root=root, log=lambda s: None, progress=False)
        with pytest.raises(ValueError, match="kv_heads: 3 must divide"):
            convert(st, "tiny", small("gqa:3", tokens=128), loaded=(m, tok), root=root,
                    log=lambda s: None, progress=False)
        assert st.measure_names() == []  # nothing stored


@pytest.mark.parametrize("argv,msg", [
    (["--tie", "gqa:0"], "tie: 'gqa:0': gqa:N needs a positive number of kv heads"),
    (["--tokens", "100"], "tokens: 100 is less than one batch"),
    (["--tie", "qk", "--start", "avg"], "start: 'avg' is not a start of tie 'qk'"),
    (["--device", "tpu"], "--device: 'tpu' is not 'cpu' or 'cuda[:N]'"),
    (["--eval-tokens", "256"], "eval_tokens: 256 is one sequence of 256"),
    (["--lr-tokens", "65536"], "--lr-tokens: the budget a rate is chosen at, so it needs "
                               "--lr-grid"),
])
def test_cli_refuses_bad_arguments_in_one_line_before_loading(argv, msg, capsys, tmp_path):
    from qkvlab.cli import main
    assert main(["convert", "nosuchmodel", "--db", str(tmp_path / "s.db"), *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and msg in err[0]
    assert not (tmp_path / "s.db").exists()  # nothing written


def test_cli_refuses_a_model_that_names_nothing_before_the_store_opens(capsys, tmp_path):
    from qkvlab.cli import main
    assert main(["convert", str(tmp_path / "nope"), "--db", str(tmp_path / "s.db")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "is not a built-in name" in err[0] and "nope" in err[0]
    assert not (tmp_path / "s.db").exists()  # nothing written


def test_cli_refuses_an_out_that_is_a_file(capsys, tmp_path):
    from qkvlab.cli import main
    (tmp_path / "f").write_text("x")
    assert main(["convert", "nosuchmodel", "--out", str(tmp_path / "f")]) == 2
    assert "--out" in capsys.readouterr().err


def test_a_kill_between_checkpoint_files_resumes_the_pair_state_json_names(tok, root, tmp_path):
    """Weights of a later step written before its state.json (a kill between them) are ignored;
    a checkpoint of the first layout (student.safetensors, optim.pt) still resumes."""
    import contextlib
    import json
    import shutil

    import safetensors.torch

    from qkvlab.hf.uptrain import Uptrainer
    teacher = tiny(tok)
    ids = token_rows(tok, "train", 512, 64, root=root)
    cfg = UptrainConfig(batch=2, seq_len=64, precision="fp32", warmup=1, lr=1e-3)

    def trainer(folder):
        s = tie(tiny(tok, seed=1), "kv", start="avg")
        return Uptrainer(s, teacher, ids, cfg, folder, contextlib.nullcontext)
    a = trainer(tmp_path / "ck")
    a.run_to(1)
    at_1 = {k: v.clone() for k, v in a.student.state_dict().items()}
    a.run_to(2, every_s=1e9)  # saved at its end: step 2's pair and state.json
    shutil.copy(tmp_path / "ck" / "student-2.safetensors", tmp_path / "s2")
    # back to step 1's state, with step 2's weights left beside it as a kill would leave them
    a2 = trainer(tmp_path / "ck1")
    a2.run_to(1)
    shutil.copy(tmp_path / "s2", tmp_path / "ck1" / "student-2.safetensors")
    b = trainer(tmp_path / "ck1")
    assert b.resume() and b.step == 1
    for k, v in b.student.state_dict().items():
        torch.testing.assert_close(v, at_1[k], rtol=0, atol=0)
    b.run_to(2)
    assert sorted(p.name for p in (tmp_path / "ck1").glob("student*")) == [
        "student-2.safetensors"]
    # the first layout: fixed names, no names in state.json
    old = tmp_path / "old"
    shutil.copytree(tmp_path / "ck1", old)
    state = json.loads((old / "state.json").read_text())
    (old / state.pop("student")).rename(old / "student.safetensors")
    (old / state.pop("optim")).rename(old / "optim.pt")
    (old / "state.json").write_text(json.dumps(state))
    c = trainer(old)
    assert c.resume() and c.step == 2
    want = safetensors.torch.load_file(str(old / "student.safetensors"))
    got = c.student.state_dict()
    for k, v in want.items():
        torch.testing.assert_close(got[k], v, rtol=0, atol=0)


def test_bench_convert_trains_every_contender_on_one_batch(tok, monkeypatch):
    from qkvlab.bench.convert import bench_convert, convert_table
    from qkvlab.hf import cost
    monkeypatch.setattr(cost, "load_lm", lambda source: (tiny(tok), tok))
    res = bench_convert("tiny", rounds=2, batch=2, seq_len=16, log=lambda s: None)
    assert [r["contender"] for r in res["rows"]] == ["qkvlab", "qkvlab_bf16_head", "plain"]
    assert all(len(r["rounds"]) == 2 and r["tokens_per_s"] > 0 for r in res["rows"])
    for key in ("ratio", "ratio_bf16_head"):
        assert res[key]["verdict"] in ("faster", "slower", "level", "undecided")
    text = convert_table(res)
    assert "qkvlab / plain loop" in text and "qkvlab with --head bf16 / plain loop" in text


def test_a_time_limit_stores_the_budgets_reached_as_the_shorter_run(tok, root, tmp_path,
                                                                    monkeypatch):
    """Budgets at 1 and 4 steps; the limit strikes inside the second: the first is stored as the
    128-token run, and the same call without a limit resumes to what a straight run gives."""
    import qkvlab.hf.convert as hc
    from qkvlab.hf.uptrain import Uptrainer
    monkeypatch.setattr(hc, "FIRST_BUDGET", 128)
    assert budgets(small(tokens=512)) == [0, 1, 4]
    m = tiny(tok)
    quiet = {"loaded": (m, tok), "root": root, "log": lambda s: None, "progress": False}
    with Store(tmp_path / "a.db") as st:
        straight = convert(st, "tiny", small(tokens=512), **quiet)
    run_to = Uptrainer.run_to

    def limited(self, step, bar=None, every_s=300.0, deadline=None):  # time runs out at step 2
        if step > 2:
            run_to(self, 2, bar, every_s)
            return run_to(self, step, bar, every_s, deadline=0.0)
        return run_to(self, step, bar, every_s)
    with Store(tmp_path / "b.db") as st:
        monkeypatch.setattr(Uptrainer, "run_to", limited)
        logs = []
        part = convert(st, "tiny", small(tokens=512), time_limit=1e9,
                       **quiet | {"log": logs.append})
        monkeypatch.setattr(Uptrainer, "run_to", run_to)
        assert [r["steps"] for r in part] == [0, 1]
        assert any("stored as the run of 128 tokens" in s for s in logs)
        assert [s["spec"]["tokens"] for s in st.measure_rows("convert")] == [128]
        # the 128-token run is read back, not computed (its records are the straight run's)
        again = convert(st, "tiny", small(tokens=128), **quiet | {"loaded": None})
        assert [r["nll_seq"] for r in again] == [r["nll_seq"] for r in straight[:2]]
        logs = []
        resumed = convert(st, "tiny", small(tokens=512), **quiet | {"log": logs.append})
    assert any("resumed at step 2" in s for s in logs)
    assert [r["nll_seq"] for r in resumed] == [r["nll_seq"] for r in straight]


def test_more_text_follows_the_train_split_and_joins_the_fingerprint(tok, root, tmp_path):
    from qkvlab.data import pysource
    more = tmp_path / "more"
    (more / "pkg" / "tests").mkdir(parents=True)
    (more / "pkg" / "a.py").write_text("def more_a():\n    return 1\n" * 50)
    (more / "pkg" / "tests" / "t.py").write_text("left out")
    train = token_rows(tok, "train", 128 * 2, 64, root=root)
    n_train = sum(len(tok(t, add_special_tokens=False)["input_ids"])
                  for t in pysource.texts("train", root))
    with pytest.raises(ValueError, match="--more-text adds training text"):
        token_rows(tok, "train", n_train + 64, 64, root=root)
    both = token_rows(tok, "train", (n_train // 64 + 2) * 64, 64, root=root, more=str(more))
    whole = torch.tensor(tok(("".join(pysource.texts("train", root))
                              + "def more_a():\n    return 1\n" * 50 + pysource.SEPARATOR),
                             add_special_tokens=False)["input_ids"])
    assert torch.equal(both[:len(train)], train)
    assert [p.name for p in pysource.more_files(more)] == ["a.py"]
    assert len(both.view(-1)) <= len(whole)  # byte-level BPE: joined text tokenizes the same
    fp = pysource.more_fingerprint(more)
    (more / "pkg" / "a.py").write_text("x = 1\n")
    assert pysource.more_fingerprint(more) != fp


@pytest.fixture
def quiet(tok, root, monkeypatch):
    """A rate grid's candidates short (256 tokens, 128 val tokens) on the tiny model, quiet."""
    import qkvlab.hf.rate as rate
    monkeypatch.setattr(rate, "TOKENS", 256)
    monkeypatch.setattr(rate, "VAL_TOKENS", 128)
    return {"loaded": (tiny(tok), tok), "root": root, "log": lambda s: None, "progress": False}


def test_a_rate_grid_is_chosen_on_val_and_the_run_is_the_chosen_rates_own(quiet, tmp_path):
    with Store(tmp_path / "a.db") as st:
        recs = convert(st, "tiny", small(tokens=256), lr_grid=(1e-5, 3e-3), **quiet)
        (row,) = st.measure_rows("convert_lr")
        val = {r["lr"]: r["val_nll"] for r in row["records"]}
        chosen = min(val, key=val.get)
        assert [r["lr"] for r in row["records"] if r["chosen"]] == [chosen]
        assert all(r["lr"] == chosen for r in recs)
        assert convert(st, "tiny", small(tokens=256, lr=chosen), **quiet) == recs  # its own run
        with pytest.raises(ValueError, match="finite positive rates"):
            convert(st, "tiny", small(tokens=256), lr_grid=(0.0,), **quiet)
    # computed again in another store, the choice is the same numbers (deterministic)
    with Store(tmp_path / "b.db") as st:
        convert(st, "tiny", small(tokens=256), lr_grid=(1e-5, 3e-3), **quiet)
        assert st.measure_rows("convert_lr")[0]["records"] == row["records"]


def test_a_rate_can_be_chosen_at_a_later_budget_as_its_own_choice(quiet, tmp_path):
    with Store(tmp_path / "a.db") as st:
        convert(st, "tiny", small(tokens=128), lr_grid=(1e-5, 3e-3), **quiet)
        convert(st, "tiny", small(tokens=128), lr_grid=(1e-5, 3e-3), lr_tokens=512, **quiet)
        rows = {r["spec"]["tokens"]: r for r in st.measure_rows("convert_lr")}
    assert set(rows) == {256, 512}  # the default budget's choice and the later one, apart
    assert {r["spec"]["grid"] == [1e-5, 3e-3] for r in rows.values()} == {True}
    # each candidate trained to its own budget: the later choice's scores are not the first's
    assert [r["val_nll"] for r in rows[512]["records"][:2]] != \
        [r["val_nll"] for r in rows[256]["records"][:2]]


def test_a_rate_chosen_on_the_grids_edge_extends_the_grid(quiet, tmp_path):
    with Store(tmp_path / "a.db") as st:
        convert(st, "tiny", small(tokens=128), lr_grid=(1e-6, 1e-5), **quiet)
        recs = st.measure_rows("convert_lr")[0]["records"]
    tried = [r["lr"] for r in recs]
    assert tried[:2] == [1e-6, 1e-5] and len(tried) > 2  # 1e-5 (the top) won: 1e-4 tried next
    assert tried[2] == pytest.approx(1e-4)
    best = min(recs, key=lambda r: r["val_nll"])
    assert best["chosen"] and best["lr"] not in (min(tried), max(tried)) or len(tried) == 5
