"""The study's convert step: ``run_convert`` stores the profile's conversions, and the curves,
the start findings, the figure, the table and Q3's sentence read back exactly what it stored.
A tiny random Llama and a folder of small .py files stand in for SmolLM2 and the stdlib."""

import dataclasses
import math

import pandas as pd
import pytest
import torch

transformers = pytest.importorskip("transformers")

from qkvlab.experiments.registry import get_profile  # noqa: E402
from qkvlab.experiments.store import Store  # noqa: E402
from qkvlab.hf import cost  # noqa: E402
from qkvlab.hf.convert import ConvertConfig, gap_ci  # noqa: E402
from qkvlab.hf.uptrain import UptrainConfig  # noqa: E402
from qkvlab.studies.qkv import study  # noqa: E402
from qkvlab.studies.qkv.compute import results  # noqa: E402
from qkvlab.studies.qkv.compute.convert import (curve_ends, curves, start_findings,  # noqa: E402
                                                tokens_to_reach)
from qkvlab.studies.qkv.render.convert import (convert_blocks, convert_headline,  # noqa: E402
                                               convert_sentence, fig_q3_convert)
from test_hf_convert import make_root, make_tok, tiny  # noqa: E402

UP = UptrainConfig(batch=2, seq_len=64, precision="fp32", warmup=1, lr=3e-3, chunk=64)
CONFIGS = tuple(ConvertConfig(tie=t, start=s, tokens=512, eval_tokens=256, calib_tokens=128,
                              uptrain=UP) for t, s in (("kv", "fitted"), ("kv", "avg"),
                                                       ("none", None)))


@pytest.fixture
def stored(tmp_path, monkeypatch):
    return _run(tmp_path, monkeypatch, CONFIGS)


def _run(tmp_path, monkeypatch, configs):
    root = make_root(tmp_path / "src" if (tmp_path / "src").mkdir() is None else None)
    monkeypatch.setenv("QKVLAB_PYSOURCE", root)
    tok = make_tok()
    p = dataclasses.replace(get_profile("smoke"), convert=configs, convert_models=("tiny",))
    monkeypatch.setattr(study, "get_profile", lambda name: p)
    loads = []

    def load(source):
        loads.append(source)
        return tiny(tok), tok

    monkeypatch.setattr(cost, "load_lm", load)
    cfg = study.StudyConfig(profile="smoke", db=str(tmp_path / "r.db"), pretrained=(),
                            log=lambda s: None, progress=False)
    with Store(cfg.db) as store:
        study.run_convert(study.Recorder(store, "smoke"), cfg)
        n_loads = len(loads)
        study.run_convert(study.Recorder(store, "smoke"), cfg)  # stored: nothing recomputed
        data = results.load(store, p)
        raw = {r["spec"]["start"]: r["records"] for r in store.measure_rows("convert")}
    assert len(loads) == n_loads
    return data, raw, tmp_path


def test_curves_hold_every_budget_and_the_paired_gap_to_the_untied_run(stored):
    data, raw, _ = stored
    df = curves(data)
    assert sorted(set(zip(df.tie, df.start))) == [("kv", "avg"), ("kv", "fitted"),
                                                    ("none", "none")]
    assert sorted(df.tokens.unique()) == [0, 512]
    fitted = df[(df.start == "fitted")].set_index("tokens")
    rec = {r["tokens"]: r for r in raw["fitted"]}
    for t in (0, 512):
        assert fitted.loc[t, "gap"] == rec[t]["gap"]
        want = gap_ci(rec[t]["nll_seq"], {r["tokens"]: r for r in raw["none"]}[t]["nll_seq"], 63)
        assert (fitted.loc[t, "vs_untied"], fitted.loc[t, "vs_lo"], fitted.loc[t, "vs_hi"]) \
            == pytest.approx(want, rel=1e-12)
    assert df[df.tie == "none"].vs_untied.isna().all()  # the baseline has no baseline


def test_start_findings_read_the_stored_numbers(stored):
    data, raw, _ = stored
    (f,) = start_findings(curves(data))
    last = {s: raw[s][-1]["gap"] for s in ("fitted", "avg")}
    assert f.better == min(last, key=last.get) and f.worse == max(last, key=last.get)
    assert f.last[f.better][1] == last[f.better] and f.target == last[f.worse]
    assert f.zero_shot == {s: raw[s][0]["gap"] for s in ("fitted", "avg")}
    text = convert_sentence(data)
    assert "after 512 tokens" in text and "Kayyam" in text


def test_figure_table_and_csv(stored):
    data, raw, tmp = stored
    fig = fig_q3_convert(data, tmp / "figs")
    assert fig is not None and (tmp / "figs" / "q3_convert.png").stat().st_size > 0
    csv = pd.read_csv(tmp / "figs" / "q3_convert.csv")
    assert len(csv) == 6 and "nll_seq" not in csv
    (table,) = convert_blocks(data)
    assert len(table.rows) == 6


def test_tokens_to_reach_interpolates_in_nats_between_measured_budgets_only():
    pts = pd.DataFrame({"tokens": [0, 16384, 65536], "gap": [20.0, 1.0, 0.5]})
    assert tokens_to_reach(pts, 25.0) == 0
    assert tokens_to_reach(pts, 0.4) is None  # never extrapolated
    # halfway in nats (ln(1 + gap)) between 16k and 64k is halfway in log tokens
    mid = math.expm1((math.log(2.0) + math.log(1.5)) / 2)
    got = tokens_to_reach(pts, mid)
    assert got == pytest.approx(math.exp((math.log(16384) + math.log(65536)) / 2), rel=1e-12)
    # from the zero-shot point linear in tokens, halfway in nats between x21 and x2
    mid0 = math.expm1((math.log(21.0) + math.log(2.0)) / 2)
    assert tokens_to_reach(pts, mid0) == pytest.approx(16384 * 0.5, rel=1e-12)
    # the same curve as % gaps, per=100, gives the same tokens
    pct = pts.assign(gap=pts.gap * 100)
    assert tokens_to_reach(pct, mid0 * 100, per=100.0) == pytest.approx(16384 * 0.5, rel=1e-12)
    # a x389,503 start and x661 at 16k: x3,167 lies three quarters of the way in nats, not at
    # the budget's very end as a straight line in the ratio would put it
    far = pd.DataFrame({"tokens": [0, 16384], "gap": [389502.0, 660.0]})
    want = 16384 * math.log(389503 / 3167) / math.log(389503 / 661)
    assert tokens_to_reach(far, 3166.0) == pytest.approx(want, rel=1e-12)
    assert tokens_to_reach(far, 3166.0) < 0.8 * 16384


def test_a_start_that_begins_below_the_others_final_gap_saved_all_its_tokens():
    df = pd.DataFrame({"model": "m", "tie": "kv", "start": ["fitted"] * 3 + ["avg"] * 3,
                       "tokens": [0, 16384, 65536] * 2,
                       "gap": [19.7, 9.0, 4.9, 3.9e5, 585.0, 524.0]})
    df = df.assign(gap_lo=df.gap * 0.9, gap_hi=df.gap * 1.1)
    (f,) = start_findings(df)
    assert (f.better, f.worse, f.began_below, f.saved, f.tokens_better) == \
        ("fitted", "avg", True, None, 0.0)
    assert f.separated and f.zero_shot == {"fitted": 19.7, "avg": 3.9e5}
    df.loc[(df.start == "fitted") & (df.tokens == 0), "gap"] = 1000.0  # now it needs 1k-16k
    (f,) = start_findings(df)
    assert not f.began_below and 0 < f.tokens_better < 16384
    assert f.saved == pytest.approx(65536 / f.tokens_better, rel=1e-12)


def test_a_start_run_to_fewer_tokens_does_not_cut_the_others_comparison_short():
    """keep_k reached only 16k tokens: fitted vs avg is still read at their common 65k, and
    fitted vs keep_k at 16k."""
    df = pd.DataFrame({"model": "m", "tie": "kv",
                       "start": ["fitted"] * 3 + ["avg"] * 3 + ["keep_k"] * 2,
                       "tokens": [0, 16384, 65536] * 2 + [0, 16384],
                       "gap": [19.7, 9.0, 4.9, 3.9e5, 585.0, 524.0, 3.9e5, 1631.0]})
    df = df.assign(gap_lo=df.gap * 0.9, gap_hi=df.gap * 1.1)
    found = {(f.better, f.worse): f for f in start_findings(df)}
    # every pair, the best start's first; each read at the budget the two share
    assert list(found) == [("fitted", "avg"), ("fitted", "keep_k"), ("avg", "keep_k")]
    assert found["fitted", "avg"].last == {"fitted": (65536, 4.9, 4.9 * 0.9, 4.9 * 1.1),
                                           "avg": (65536, 524.0, 524.0 * 0.9, 524.0 * 1.1)}
    assert found["fitted", "avg"].tokens_worse == 65536
    assert found["fitted", "keep_k"].tokens_worse == 16384
    assert found["fitted", "keep_k"].last["keep_k"][:2] == (16384, 1631.0)
    assert found["avg", "keep_k"].last == {"avg": (16384, 585.0, 585.0 * 0.9, 585.0 * 1.1),
                                           "keep_k": (16384, 1631.0, 1631.0 * 0.9,
                                                      1631.0 * 1.1)}
    assert found["avg", "keep_k"].separated  # 643.5 < 1467.9


def test_the_answers_open_with_the_conversion_where_nothing_else_ran(stored):
    from qkvlab.studies.qkv.render.answers import answer_blocks
    data, _, _ = stored
    assert data.comparisons.empty
    blocks = answer_blocks(data)
    assert blocks[-1].text.endswith(convert_sentence(data, None))
    assert "only converts trained decoders" in blocks[-1].text


def test_a_gpu_curve_at_another_batch_is_its_own_curve_and_ends_where_measured():
    """CPU starts (batch 4) are compared with each other; a GPU curve (batch 32, more text) is
    not mixed into them, and its end is read at the last budget with an untied baseline."""
    cpu = pd.DataFrame({"model": "m", "tie": "kv", "start": ["fitted"] * 2 + ["avg"] * 2,
                        "tokens": [0, 65536] * 2, "gap": [19.7, 4.9, 3.9e5, 524.0],
                        "batch": 4, "corpus": "c", "vs_untied": [19.7, 5.5, 3.9e5, 570.0]})
    gpu = pd.DataFrame({"model": "m", "tie": "kv", "start": "fitted",
                        "tokens": [0, 65536, 4194304, 16777216], "gap": [19.7, 9.3, 0.139, -0.078],
                        "batch": 32, "corpus": "c+more:x",
                        "vs_untied": [19.7, 10.0, 0.602, math.nan]})
    df = pd.concat([cpu, gpu], ignore_index=True)
    df = df.assign(gap_lo=df.gap - 0.01, gap_hi=df.gap + 0.01, vs_lo=df.vs_untied - 0.01,
                   vs_hi=df.vs_untied + 0.01)
    (f,) = start_findings(df)
    assert (f.batch, f.better, f.last["fitted"][1]) == (4, "fitted", 4.9)  # the CPU's own point
    ends = {(e.start, e.batch): e for e in curve_ends(df)}
    g = ends[("fitted", 32)]
    assert g.more_text and g.paired[:2] == (4194304, 0.139) and g.paired[4] == 0.602
    assert g.last[:2] == (16777216, -0.078)
    assert not ends[("fitted", 4)].more_text and ends[("fitted", 4)].last[0] == 65536


def test_a_run_at_another_rate_is_its_own_curve(stored):
    """Gemma's K=V at the rate chosen on val beside the same start at 1e-4: two curves, each
    with its own end, never one zigzag; starts are compared only at one rate; the table and the
    figure say each rate."""
    df = pd.DataFrame({"model": "m", "tie": "kv", "start": ["fitted"] * 4 + ["avg"] * 2,
                       "tokens": [0, 16384] * 3, "gap": [0.9, 1.3, 0.9, 0.2, 9.0, 5.0],
                       "batch": 4, "corpus": "c", "lr": [1e-4] * 2 + [1e-5] * 2 + [1e-4] * 2,
                       "vs_untied": [0.9, 2.7, 0.9, math.nan, 9.0, 6.0]})
    df = df.assign(gap_lo=df.gap - 0.01, gap_hi=df.gap + 0.01, vs_lo=df.vs_untied - 0.01,
                   vs_hi=df.vs_untied + 0.01)
    ends = {(e.start, e.lr): e for e in curve_ends(df)}
    assert set(ends) == {("fitted", 1e-4), ("fitted", 1e-5), ("avg", 1e-4)}
    assert ends[("fitted", 1e-5)].last[:2] == (16384, 0.2)
    assert ends[("fitted", 1e-5)].paired is None  # no untied baseline at that rate
    assert ends[("fitted", 1e-4)].paired[:2] == (16384, 1.3)
    (f,) = start_findings(df)  # fitted vs avg at 1e-4 only: 1e-5 has no second start
    assert (f.lr, f.better, f.last["fitted"][1]) == (1e-4, "fitted", 1.3)
    data, _, tmp = stored
    (table,) = convert_blocks(data)
    assert "rate" in table.headers and {r[table.headers.index("rate")] for r in table.rows} \
        == {f"{UP.lr:.2g}"}


def test_w_o_in_the_untied_basis_is_its_own_curve_paired_with_the_untied_run(tmp_path,
                                                                           monkeypatch):
    """The fitted start uptrained with W_O in the untied basis (hf.basis) beside the fitted
    start as folded: two curves from one zero-shot model, each paired with the untied run, and
    compared as two starts are."""
    wo = dataclasses.replace(CONFIGS[0], uptrain=dataclasses.replace(UP, o_basis="untied"))
    data, _, _ = _run(tmp_path, monkeypatch, CONFIGS + (wo,))
    df = curves(data)
    f, w = (df[df.start == s].set_index("tokens") for s in ("fitted", "fitted_wo"))
    assert list(f.index) == list(w.index) == [0, 512]
    assert w.gap[0] == pytest.approx(f.gap[0], rel=1e-4)  # one model, to fp32 rounding
    assert w.gap[512] != f.gap[512]  # another uptraining
    assert not math.isnan(w.vs_untied[512]) and not math.isnan(f.vs_untied[512])
    found = start_findings(df)  # every pair of the three starts
    assert sorted(tuple(sorted((x.better, x.worse))) for x in found) == [
        ("avg", "fitted"), ("avg", "fitted_wo"), ("fitted", "fitted_wo")]


def test_the_rate_table_shows_each_rate_tried_on_val_and_the_choice():
    from qkvlab.studies.qkv.render.convert_rates import rate_blocks
    from qkvlab.studies.qkv.render.ties import ppl_text

    def grid(version, recs, tokens=16384):
        return [{"lr": lr, "val_nll": nll, "chosen": ch, "diverged": dv, "spec.model": "smollm2",
                 "spec.tie": "kv", "spec.start": "fitted", "spec.tokens": tokens,
                 "spec.version": version} for lr, nll, ch, dv in recs]
    df = pd.DataFrame(grid(3, [(1e-5, 3.2932, False, False), (3.3e-6, 3.2465, True, False),
                               (1e-4, 4.589, False, False), (3e-4, math.inf, False, True)])
                      + grid(1, [(1e-4, 1.0, True, False)])  # no edge extension: left out
                      + grid(2, [(9e-6, 4.1, True, False), (1e-4, 4.5, False, False)])
                      + grid(3, [(1e-4, 2.0, True, False)], tokens=65536))  # a later budget
    data = results.StudyData(profile=None, runs=None, comparisons=None, probe=None,
                             measures={"convert_lr": df})
    (table,) = rate_blocks(data)
    assert table.headers[3:6] == ("tokens", "val rows", "rate")
    got = [(r[3], r[4], r[5], r[6], r[7]) for r in table.rows]
    assert got == [
        ("16,384", "first files", "0.0001", ppl_text(math.exp(4.5)), ""),
        ("16,384", "first files", "9e-06", ppl_text(math.exp(4.1)), "chosen"),
        ("16,384", "spread over the split", "0.0003", "diverged", ""),
        ("16,384", "spread over the split", "0.0001", ppl_text(math.exp(4.589)), ""),
        ("16,384", "spread over the split", "1e-05", ppl_text(math.exp(3.2932)), ""),
        ("16,384", "spread over the split", "3.3e-06", ppl_text(math.exp(3.2465)), "chosen"),
        ("65,536", "spread over the split", "0.0001", ppl_text(math.exp(2.0)), "chosen")]
    assert rate_blocks(results.StudyData(profile=None, runs=None, comparisons=None,
                                         probe=None, measures={})) == []


def test_val_rows_spread_over_the_whole_split(tmp_path, monkeypatch):
    """The rate's val rows are taken evenly from every file of the split (first and last rows
    included), each row the split's own ids; too few rows is refused naming both counts."""
    from qkvlab.data import pysource
    from qkvlab.hf.rate import val_rows
    root = make_root(tmp_path / "src" if (tmp_path / "src").mkdir() is None else None)
    tok = make_tok()
    ids = [i for t in pysource.texts("val", root)
           for i in tok(t, add_special_tokens=False)["input_ids"]]
    n = len(ids) // 16
    whole = torch.tensor(ids[:n * 16]).view(n, 16)
    got = val_rows(tok, 3 * 16, 16, root=root)
    assert n >= 3 and torch.equal(got, whole[[0, round((n - 1) / 2), n - 1]])
    assert torch.equal(val_rows(tok, n * 16, 16, root=root), whole)
    with pytest.raises(ValueError, match=f"holds {n} rows of 16 tokens, need {n + 1}"):
        val_rows(tok, (n + 1) * 16, 16, root=root)


def _grid_profile(tmp_path, monkeypatch, **kw):
    """(profile, study config): smoke converting the tiny stand-in with CONFIGS, its rate
    chosen on val from (1e-5, 1e-3) with short candidates; ``kw`` more profile fields."""
    import qkvlab.hf.rate as rate
    monkeypatch.setattr(rate, "TOKENS", 256)
    monkeypatch.setattr(rate, "VAL_TOKENS", 128)
    root = make_root(tmp_path / "src" if (tmp_path / "src").mkdir() is None else None)
    monkeypatch.setenv("QKVLAB_PYSOURCE", root)
    tok = make_tok()
    p = dataclasses.replace(get_profile("smoke"), convert=CONFIGS, convert_models=("tiny",),
                            convert_lr_grid=(1e-5, 1e-3), **kw)
    monkeypatch.setattr(study, "get_profile", lambda name: p)
    monkeypatch.setattr(cost, "load_lm", lambda source: (tiny(tok), tok))
    return p, study.StudyConfig(profile="smoke", db=str(tmp_path / "r.db"), pretrained=(),
                                log=lambda s: None, progress=False)


def test_a_profile_grid_chooses_one_rate_on_val_and_every_arm_trains_at_it(tmp_path, monkeypatch):
    p, cfg = _grid_profile(tmp_path, monkeypatch)
    with Store(cfg.db) as store:
        study.run_convert(study.Recorder(store, "smoke"), cfg)
        (grid,) = store.measure_rows("convert_lr")
        rows = store.measure_rows("convert")
        study.run_convert(study.Recorder(store, "smoke"), cfg)  # stored: nothing recomputed
        assert store.measure_rows("convert") == rows
        assert len(store.measure_rows("convert_lr")) == 1
        data = results.load(store, p)
    from qkvlab.studies.qkv.render.page import q3_blocks
    titles = [b.caption for b in q3_blocks(data) if hasattr(b, "caption")]
    assert any(t.startswith("The uptraining rate, chosen on validation text") for t in titles)
    assert (grid["spec"]["tie"], grid["spec"]["start"]) == ("kv", "fitted")
    val = {r["lr"]: r["val_nll"] for r in grid["records"]}
    chosen = min(val, key=val.get)
    assert chosen != UP.lr and [r["lr"] for r in grid["records"] if r["chosen"]] == [chosen]
    assert sorted((r["spec"]["tie"], r["spec"]["start"]) for r in rows) == [
        ("kv", "avg"), ("kv", "fitted"), ("none", "none")]
    for r in rows:  # every arm at the chosen rate, in its spec and in each record
        assert r["spec"]["uptrain"]["lr"] == chosen
        assert {x["lr"] for x in r["records"]} == {chosen}


def test_a_profile_chooses_w_os_basis_with_the_rate_and_the_rate_table_names_it(tmp_path,
                                                                               monkeypatch):
    from qkvlab.studies.qkv.render.convert_rates import rate_blocks
    p, cfg = _grid_profile(tmp_path, monkeypatch, convert_o_bases=("tied", "untied"))
    with Store(cfg.db) as store:
        study.run_convert(rec := study.Recorder(store, "smoke"), cfg)
        assert rec.notes == []
        grids = {g["spec"]["uptrain"].get("o_basis", "tied"): g["records"]
                 for g in store.measure_rows("convert_lr")}
        rows = store.measure_rows("convert")
        data = results.load(store, p)
    best = {b: min(r["val_nll"] for r in g if not r["diverged"]) for b, g in grids.items()}
    basis = min(best, key=best.get)
    lr = next(r["lr"] for r in grids[basis] if r["chosen"])
    fitted = next(r for r in rows if r["spec"]["start"] == "fitted")
    assert fitted["spec"]["uptrain"].get("o_basis", "tied") == basis
    for r in rows:  # every arm at the chosen basis's rate; only the fitted start in its basis
        assert r["spec"]["uptrain"]["lr"] == lr
        assert r is fitted or "o_basis" not in r["spec"]["uptrain"]
    (table,) = rate_blocks(data)
    assert {r[2] for r in table.rows} == {"fitted", "fitted (W_O untied basis)"}
    marks = {r[2]: r[7] for r in table.rows if r[7]}  # each grid's rate; the winner's basis
    won = "fitted" if basis == "tied" else "fitted (W_O untied basis)"
    assert marks == {s: "chosen, basis too" if s == won else "chosen in its basis"
                     for s in ("fitted", "fitted (W_O untied basis)")}


def test_a_profile_whose_rate_cannot_be_chosen_runs_no_other_arm(tmp_path, monkeypatch):
    p = dataclasses.replace(get_profile("smoke"), convert=CONFIGS, convert_models=("absent",),
                            convert_lr_grid=(1e-5, 3e-3))
    monkeypatch.setattr(study, "get_profile", lambda name: p)

    def load(source):
        raise ValueError(f"{source}: not fetched")
    monkeypatch.setattr(cost, "load_lm", load)
    cfg = study.StudyConfig(profile="smoke", db=str(tmp_path / "r.db"), pretrained=(),
                            log=lambda s: None, progress=False)
    with Store(cfg.db) as store:
        rec = study.Recorder(store, "smoke")
        study.run_convert(rec, cfg)
        assert store.measure_rows("convert") == [] and store.measure_rows("convert_lr") == []
    assert rec.notes == ["convert (absent kv/fitted): measure convert_lr failed: ValueError: "
                         "absent: not fetched",
                         "convert (absent): no rate chosen on val, so no other conversion of "
                         "it ran"]


def test_q2_words_the_conversions_to_q_eq_k_and_q3_the_rest(monkeypatch):
    """Each question's sentence covers its own ties (Q=K and Q=K=V in Q2, K=V and MQA in Q3),
    every tie where no question is named; Kayyam's K=V number closes Q3's only."""
    import qkvlab.studies.qkv.render.convert as rc
    df = pd.DataFrame({"model": "m", "tie": ["kv"] * 2 + ["qk"] * 2 + ["mqa"] * 2,
                       "start": ["fitted"] * 4 + ["mean_pool"] * 2, "tokens": [0, 16384] * 3,
                       "gap": [19.7, 9.0, 400.0, 379.0, 2600.0, 106.0], "batch": 4,
                       "corpus": "c", "lr": 1e-4,
                       "vs_untied": [19.7, 10.0, 400.0, 428.0, 2600.0, 120.0]})
    df = df.assign(gap_lo=df.gap * 0.9, gap_hi=df.gap * 1.1, vs_lo=df.vs_untied * 0.9,
                   vs_hi=df.vs_untied * 1.1)
    monkeypatch.setattr(rc, "curves", lambda data: df)
    q2, q3, every = (convert_sentence(None, q) for q in ("q2", "q3", None))
    assert "converted to Q=K " in q2 and "K=V" not in q2 and "MQA" not in q2
    assert "Kayyam" not in q2 and "×429" in q2  # 428 as a ratio
    assert "converted to K=V " in q3 and "converted to MQA " in q3 and "Q=K" not in q3
    assert "Kayyam" in q3 and "×11" in q3  # K=V's 10.0 over the untied model, as a ratio
    assert all(t in every for t in ("converted to Q=K ", "converted to K=V ", "MQA"))
    monkeypatch.setattr(rc, "curves", lambda data: df[df.tie != "qk"])
    assert convert_sentence(None, "q2") == ""


def test_the_page_is_made_again_from_the_rows_kept_as_json(stored):
    """scripts/convert-report.py: a store's rows written out with --rows-out and drawn from an
    empty store give the page the store itself gives, and a missing store is one line."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    _, raw, tmp = stored
    script = Path(__file__).resolve().parents[1] / "scripts" / "convert-report.py"

    def page(*args):
        out = subprocess.run([sys.executable, str(script), *args], capture_output=True,
                             text=True, check=False)
        return out.returncode, out.stdout, out.stderr

    rc, from_db, err = page(str(tmp / "r.db"), str(tmp / "figs"), "--rows-out",
                            str(tmp / "rows.json"), "--what", "the test's runs")
    assert rc == 0, err
    kept = json.loads((tmp / "rows.json").read_text())
    assert kept["what"] == "the test's runs"
    assert sorted(r["name"] for r in kept["rows"]) == ["convert"] * 3 + ["convert_teacher"]
    assert {r["spec"]["start"]: r["records"] for r in kept["rows"]
            if r["name"] == "convert"} == raw
    csv = (tmp / "figs" / "q3_convert.csv").read_text()
    rc, from_json, err = page("-", str(tmp / "figs"), "--add", str(tmp / "rows.json"))
    assert rc == 0, err
    assert from_json == from_db.split("\n", 1)[1]  # the first line says where the rows went
    assert (tmp / "figs" / "q3_convert.csv").read_text() == csv
    readme = tmp / "README.md"
    readme.write_text("top\n<!-- convert: begin -->\nold\n<!-- convert: end -->\nbottom\n")
    rc, said, err = page("-", str(tmp / "figs"), "--add", str(tmp / "rows.json"), "--readme",
                         str(readme))
    assert rc == 0, err
    assert readme.read_text() == ("top\n<!-- convert: begin -->\n"
                                  f"{convert_headline(stored[0])}\n<!-- convert: end -->\nbottom\n")
    readme.write_text("no markers\n")
    rc, _, err = page("-", str(tmp / "figs"), "--add", str(tmp / "rows.json"), "--readme",
                      str(readme))
    assert rc == 1 and "no '<!-- convert: begin -->'" in err
    rc, _, err = page(str(tmp / "nothing.db"), str(tmp / "c"))
    assert rc == 1 and err.strip() == (f"{tmp / 'nothing.db'}: no store there (give '-' to "
                                       "draw only the --add rows)")


def _sentence_curves(**cols) -> pd.DataFrame:
    """compute.convert.curves' frame for model m's K=V curves at batch 4: ``cols`` (start,
    tokens, gap, lr, vs_untied), each interval ±10%."""
    df = pd.DataFrame({"model": "m", "tie": "kv", "batch": 4, "corpus": "c", **cols})
    return df.assign(gap_lo=df.gap * 0.9, gap_hi=df.gap * 1.1, vs_lo=df.vs_untied * 0.9,
                     vs_hi=df.vs_untied * 1.1)


def test_a_pair_of_starts_says_its_rate_where_the_model_ran_at_two(monkeypatch):
    import qkvlab.studies.qkv.render.convert as rc
    df = _sentence_curves(start=["fitted", "fitted", "avg", "avg"] * 2, tokens=[0, 16384] * 4,
                          gap=[19.7, 9.0, 3.9e5, 585.0] * 2, lr=[1e-4] * 4 + [3e-4] * 4,
                          vs_untied=[19.7, 10.0, 3.9e5, 600.0] * 2)
    monkeypatch.setattr(rc, "curves", lambda data: df)
    said = convert_sentence(None)
    # one pair per model and tie in words (the first listed at the largest budget); the pair
    # at the other rate is a row of the table the words point to
    assert "converted to K=V at rate 0.0001: from the fitted start" in said
    assert "at rate 0.0003" not in said and said.endswith(
        "Every other pair of starts and every curve's numbers are in the conversion tables.")
    (table,) = rc.start_blocks(None)
    assert [r[2:6] for r in table.rows] == [("4, 0.0001", "fitted vs avg", "×20.7 vs ×390,001",
                                             "16,384"),
                                            ("4, 0.0003", "fitted vs avg", "×20.7 vs ×390,001",
                                             "16,384")]
    monkeypatch.setattr(rc, "curves", lambda data: df[df.lr == 1e-4])  # one rate: not said
    said = convert_sentence(None)
    assert "at rate" not in said and "conversion tables" not in said


def test_a_curve_whose_pair_was_read_before_its_end_still_says_its_end(monkeypatch):
    """fitted ran to 65,536 tokens, avg to 16,384: the pair is read at 16,384, and fitted's
    own end (with its untied baseline) is said too; a curve told to its end is not said twice."""
    import qkvlab.studies.qkv.render.convert as rc
    df = _sentence_curves(start=["fitted"] * 3 + ["avg"] * 2, tokens=[0, 16384, 65536, 0, 16384],
                          gap=[19.7, 9.0, 2.5, 3.9e5, 585.0], lr=1e-4,
                          vs_untied=[19.7, 10.0, 2.4, 3.9e5, 600.0])
    monkeypatch.setattr(rc, "curves", lambda data: df)
    said = convert_sentence(None)
    assert "after 16,384 tokens of uptraining" in said
    assert "from the fitted start, uptrained at batch 4: after 65,536 tokens" in said
    monkeypatch.setattr(rc, "curves", lambda data: df[df.tokens < 65536])
    assert "uptrained at batch 4:" not in convert_sentence(None)


def test_a_pair_says_each_starts_gap_over_the_untied_run_and_its_batch_where_there_are_two(
        monkeypatch):
    """Two K=V starts at batch 4 and two at batch 32: each pair names its batch and states both
    starts' gaps over the untied baseline, so no curve's end is said again; without a baseline
    for one start the pair says none, and that start's end is said on its own."""
    import qkvlab.studies.qkv.render.convert as rc
    df = _sentence_curves(start=["fitted", "fitted", "avg", "avg"] * 2, tokens=[0, 16384] * 4,
                          gap=[19.7, 9.0, 3.9e5, 585.0] * 2, lr=1e-4,
                          vs_untied=[19.7, 10.0, 3.9e5, 600.0] * 2)
    df.loc[4:, "batch"] = 32
    monkeypatch.setattr(rc, "curves", lambda data: df)
    said = convert_sentence(None)
    # one pair per model and tie in words (batch 4's, listed first); batch 32's is a row of
    # the table the words point to, which states both starts' gaps over the baseline too
    assert "converted to K=V at batch 4: from the fitted start" in said
    assert "at batch 32" not in said and "in the conversion tables" in said
    assert said.count("(the intervals do not overlap), and over the untied model uptrained on "
                      "the same tokens the same way ×11 (×10 to ×12) against ×601 (×541 to "
                      "×661)") == 1
    assert "uptrained at batch" not in said  # no curve was read further than the pair
    (table,) = rc.start_blocks(None)
    assert [(r[2], r[8]) for r in table.rows] == [
        (f"{b}, 0.0001", "×11 (×10 to ×12) vs ×601 (×541 to ×661)") for b in (4, 32)]
    one = df[df.batch == 4].assign(vs_untied=[19.7, 10.0, None, None],
                                   vs_lo=[17.7, 9.0, None, None], vs_hi=[21.7, 11.0, None, None])
    monkeypatch.setattr(rc, "curves", lambda data: one)
    said = convert_sentence(None)
    assert "at batch" not in said.split(";")[0]  # one batch: not named
    assert "against ×601" not in said
    assert ("from the fitted start, uptrained at batch 4: after 16,384 tokens ×10 (×9.1 to "
            "×10.9) over the teacher and ×11 (×10 to ×12) over the untied model") in said


def test_the_headline_is_each_models_k_eq_v_curve_measured_furthest_against_its_baseline(
        monkeypatch):
    """Per model, the K=V curve whose gap over the untied run was read at the largest budget
    (a longer curve without a baseline there, or another tie, is not it), at equal budgets the
    lower gap; models furthest first; nothing where no K=V curve has a baseline."""
    import qkvlab.studies.qkv.render.convert as rc
    df = _sentence_curves(start=["fitted"] * 3 + ["avg"] * 3, tokens=[0, 16384, 65536] * 2,
                          gap=[19.7, 9.0, 2.5, 3.9e5, 585.0, 500.0], lr=1e-4,
                          vs_untied=[19.7, 10.0, 2.4, 3.9e5, 600.0, None])
    mqa = _sentence_curves(start=["fitted"] * 2, tokens=[0, 262144], gap=[60.0, 1.0], lr=1e-4,
                           vs_untied=[60.0, 1.2]).assign(tie="mqa")
    other = _sentence_curves(start=["fitted"] * 2, tokens=[0, 1024], gap=[5.0, 0.5], lr=1e-4,
                             vs_untied=[5.0, 0.6]).assign(model="n", batch=32)
    monkeypatch.setattr(rc, "curves", lambda data: pd.concat([df, mqa, other]))
    said = convert_headline(None)
    assert said.index("m from the fitted start, after 65,536 tokens at batch 4: ×3.4 (×3.16 "
                      "to ×3.64) over the untied model") < said.index("n from the fitted start, "
                                                                     "after 1,024 tokens at batch 32")
    assert "262,144" not in said and "avg" not in said.split("Kayyam")[0]
    same = df.assign(vs_untied=[19.7, 10.0, 2.4, 3.9e5, 600.0, 1.5],
                     vs_lo=lambda d: d.vs_untied * 0.9, vs_hi=lambda d: d.vs_untied * 1.1)
    monkeypatch.setattr(rc, "curves", lambda data: same)  # both at 65,536: avg's lower gap
    assert "m from the avg start, after 65,536 tokens" in convert_headline(None)
    monkeypatch.setattr(rc, "curves", lambda data: mqa)
    assert convert_headline(None) == ""


def test_the_convert_and_scaling_profiles_analyse_no_pretrained_zoo():
    """`make report` fetches no zoo for them, so a zoo analysis there would only fail on every
    model not installed; quick and smoke read the installed few, the larger profiles all."""
    assert study.pretrained_for("convert") == study.pretrained_for("scaling") == ()
    assert study.pretrained_for("quick") == study.PRETRAINED
    assert set(study.pretrained_for("standard")) == set(study.ZOO)


def test_a_run_trained_in_fp32_is_its_own_curve_paired_with_an_fp32_baseline(monkeypatch):
    """The same command on a CPU without native bf16 trains in fp32 (the record's precision):
    beside the bf16 curves of one model, rate and batch it is another curve, paired only with
    the untied run trained in fp32, its pairs of starts never mixed with bf16's, and the words,
    tables and headline say which precision where a model has both."""
    import qkvlab.studies.qkv.render.convert as rc
    rows = []
    for prec, tie, start, gaps in (("bf16", "kv", "fitted_wo", (19.7, 3.7)),
                                   ("fp32", "kv", "fitted_wo", (19.7, 3.9)),
                                   ("fp32", "kv", "avg", (3.9e3, 40.0)),
                                   ("fp32", "none", "none", (0.0, -0.1))):
        for t, g in zip((0, 16384), gaps):
            rows.append({"model": "m", "tie": tie, "start": start, "tokens": t, "gap": g,
                         "precision": prec, "batch": 4, "corpus": "c", "lr": 1e-5,
                         "spec.uptrain.seq_len": 256, "ppl": 5 * (1 + g)})
    df = pd.DataFrame(rows)
    rng = torch.Generator().manual_seed(0)
    base = torch.rand(32, generator=rng, dtype=torch.float64) + 1
    # each run's per-sequence nll: the baseline's plus its gap, so pairing decides vs_untied
    nll = {i: (base * (1 + (r["gap"] if r["tie"] != "none" else 0)) if r["tie"] != "none"
               else base * (1 + 0.1 * r["tokens"] / 16384)).tolist() for i, r in df.iterrows()}

    def paired(frame):
        out = frame.copy()
        out[["vs_untied", "vs_lo", "vs_hi"]] = math.nan
        for i, r in frame.iterrows():
            b = frame[(frame.tie == "none") & (frame.tokens == r.tokens)
                      & (frame.precision == r.precision)]
            if r.tie != "none" and len(b):
                out.loc[i, ["vs_untied", "vs_lo", "vs_hi"]] = gap_ci(nll[i], nll[b.index[0]],
                                                                     255)
        return out.assign(gap_lo=df.gap * 0.9, gap_hi=df.gap * 1.1)
    df = paired(df)
    ends = {(e.start, e.precision): e for e in curve_ends(df)}
    assert set(ends) == {("fitted_wo", "bf16"), ("fitted_wo", "fp32"), ("avg", "fp32")}
    assert ends[("fitted_wo", "bf16")].paired is None  # no bf16 baseline at this rate
    assert ends[("fitted_wo", "fp32")].paired[:2] == (16384, 3.9)
    (f,) = start_findings(df)  # fp32's fitted vs avg; bf16's fitted has no second start
    assert (f.precision, f.better, f.worse, f.last["fitted_wo"][1]) == ("fp32", "fitted_wo",
                                                                        "avg", 3.9)
    monkeypatch.setattr(rc, "curves", lambda data: df)
    said = convert_sentence(None)
    assert "converted to K=V, trained in fp32: from the fitted (W_O untied basis) start" in said
    (table,) = rc.start_blocks(None)
    assert [r[2] for r in table.rows] == ["4, 1e-05, fp32"]
    assert "m from the fitted (W_O untied basis) start, after 16,384 tokens at batch 4 in fp32" \
        in convert_headline(None)
    monkeypatch.setattr(rc, "curves", lambda data: df[df.precision == "fp32"])  # one: not said
    assert "fp32" not in convert_sentence(None).split("Kayyam")[0]
