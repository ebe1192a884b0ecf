"""The study's tie-cost step: ``run_tie_cost`` measures the profile's decoders through the store,
and the table, the per-layer figure and the verdict sentences read back exactly what it stored,
at the profile's sizes only. Tiny random HF models stand in for the zoo's GGUF files."""

import dataclasses
import math

import pandas as pd
import pytest

transformers = pytest.importorskip("transformers")

from qkvlab.experiments.registry import get_profile  # noqa: E402
from qkvlab.experiments.store import Store  # noqa: E402
from qkvlab.report.blocks import Para  # noqa: E402
from qkvlab.hf import cost  # noqa: E402
from qkvlab.hf.cost import CostConfig  # noqa: E402
from qkvlab.studies.qkv import study  # noqa: E402
from qkvlab.studies.qkv.compute import results  # noqa: E402
from qkvlab.studies.qkv.render import tables  # noqa: E402
from qkvlab.studies.qkv.render.figures_zoo import fig_q3_tie_layers  # noqa: E402
from qkvlab.studies.qkv.compute.ties import tie_costs  # noqa: E402
from qkvlab.studies.qkv.render.ties import ppl_change, ppl_text, tie_cost_sentence  # noqa: E402
from test_hf_cost import tiny_gemma3_mqa, tiny_llama  # noqa: E402

CFG = CostConfig(seq_len=8, eval_tokens=16, calib_tokens=24, batch=2)


@pytest.fixture
def profile(monkeypatch):
    """smoke with a tie-cost plan over two stand-in models; loads counted."""
    p = dataclasses.replace(get_profile("smoke"), tie_cost=CFG, tie_cost_per_layer=("kv",),
                            tie_cost_models=("tiny", "gemma-mqa"))
    monkeypatch.setattr(study, "get_profile", lambda name: p)
    loads = []

    def load(source):
        loads.append(source)
        return {"tiny": tiny_llama, "gemma-mqa": tiny_gemma3_mqa}[source](), None

    def ids(tok, split, n, seq_len, translation, skip=0):
        import torch
        g = torch.Generator().manual_seed({"train": 1, "test": 2}[split] + skip)
        return torch.randint(0, 50, (n // seq_len, seq_len), generator=g)

    monkeypatch.setattr(cost, "load_lm", load)
    monkeypatch.setattr(cost, "bible_ids", ids)
    return p, loads


def _run(tmp_path, p):
    cfg = study.StudyConfig(profile="smoke", db=str(tmp_path / "r.db"), pretrained=(),
                            log=lambda s: None)
    with Store(cfg.db) as store:
        rec = study.Recorder(store, "smoke")
        study.run_tie_cost(rec, cfg)
        stored = {m: cost.measure_tie_cost(store, m, cost.KINDS, CFG, ("kv",), log=lambda s: None)
                  for m in p.tie_cost_models}  # read back: nothing new is computed
        data = results.load(store, p)
    return rec, stored, data


def test_study_measures_each_model_once_and_the_report_reads_it_back(tmp_path, profile):
    p, loads = profile
    rec, stored, data = _run(tmp_path, p)
    assert loads == ["tiny", "gemma-mqa"] and rec.notes == []
    table, refused = tables.tie_cost_blocks(data)
    want = [r for m in p.tie_cost_models for r in stored[m]
            if r["tie"] != "fit" and r["layers"] == "all" and r["stage"] != "refused"]
    assert len(table.rows) == len(want) == 5 + 2  # tiny: untied and 4 ties, gemma: untied and K=V
    got = {(row[0], row[1]): row for row in table.rows}
    label = {"none": "untied", "kv": "K=V", "qk": "Q=K", "qkv": "Q=K=V",
             "gqa": "GQA (kv heads mean-pooled to 1)"}
    for r in want:
        row = got[(r["model"], label[r["tie"]])]
        assert row[2] == ppl_text(r["ppl"]) and row[3] == ppl_text(r["ppl_base"])
        assert row[4] == f"{r['delta_nll']:+.3f}" and row[5] == ppl_change(100 * math.expm1(r["delta_nll"]))
    assert "gemma-mqa Q=K" in refused.text and "gemma-mqa GQA" in refused.text
    assert "single kv head" in refused.text and "RMSNorms" in refused.text


def test_figure_and_sentences_are_the_stored_records(tmp_path, profile):
    p, _ = profile
    _, stored, data = _run(tmp_path, p)
    fig = fig_q3_tie_layers(data, tmp_path)
    csv = pd.read_csv(tmp_path / fig.csv)
    want = [r for m in p.tie_cost_models for r in stored[m]
            if r["tie"] == "kv" and r["layers"] != "all"]
    assert len(csv) == len(want) == 4
    for r in want:
        row = csv[(csv.model == r["model"]) & (csv.layer == int(r["layers"]))].iloc[0]
        assert math.isclose(row.pct, 100 * math.expm1(r["delta_nll"]), rel_tol=1e-9)
        assert row.depth == int(r["layers"]) / (r["n_layers"] - 1)
    q3 = tie_cost_sentence(data, ("kv", "gqa"))
    kv = next(r for r in stored["tiny"] if r["tie"] == "kv" and r.get("stage") == "zero-shot" and r["layers"] == "all")
    assert f"K=V {ppl_text(kv['ppl'])} (" in q3 and "GQA (kv heads mean-pooled to 1) not possible" in q3
    assert "one layer at a time: median" in q3 and "Adam" not in q3 and "heal" not in q3
    q2 = tie_cost_sentence(data, ("qk", "qkv"))
    assert "Q=K not possible (its q/k RMSNorms make Q=K a nonlinear fit)" in q2 and "Q=K=V" in q2
    assert "GQA (kv heads mean-pooled to 1) not possible (the model already has a single kv head (MQA))" in q3


def test_other_sizes_and_old_versions_are_not_shown(tmp_path, profile):
    p, _ = profile
    with Store(tmp_path / "r.db") as store:
        other = dataclasses.replace(CFG, eval_tokens=32)
        cost.measure_tie_cost(store, "tiny", ("kv",), other, log=lambda s: None)
        rec = {"model": "tiny", "tie": "kv", "layers": "all", "stage": "zero-shot", "ppl": 1.0}
        store.measure("tie_cost", {"model": "tiny", "tie": "kv", "layers": "all", "version": 1}, lambda: [rec])
        data = results.load(store, p)
        assert tie_costs(data).empty and tie_cost_sentence(data, ("kv",)) == ""
        assert "not measured in this store" in tables.tie_cost_blocks(data)[0].text
        # a profile that measures none shows what a user stored at any size (current version)
        shown = tie_costs(results.load(store, get_profile("smoke")))
    assert set(shown["spec.eval_tokens"]) == {32}


OLD_SIZES = {"translation": "3", "seq_len": 8, "eval_tokens": 16, "calib_tokens": 24, "batch": 2}
OLD_HEALED = {"heal_steps": 2, "heal_batch": 2, "heal_lrs": [0.01], "val_tokens": 16}


def _old_records(store, version, stages=("zero-shot", "healed")):
    """What tiecost stored when it healed (version 4): a zero-shot and a healed record per tie,
    the spec carrying the heal fields."""
    for tie in ("none", "kv"):
        base = {"model": "tiny", "n_layers": 2, "tie": tie, "layers": "all", "ppl": 60.0, "ppl_base": 50.0,
                "ppl_loaded": 50.0, "delta_ppl": 10.0, "delta_nll": math.log(1.2), "eval_tokens": 16,
                "calib_tokens": 24, "heal_steps": 0, "heal_tokens": 0, "kv_cache": 1.0, "attn_params": 1.0,
                "seconds": 1.0}
        recs = [{**base, "stage": "zero-shot"},
                {**base, "stage": "healed", "heal_steps": 2, "heal_tokens": 32, "heal_lr": 0.01,
                 "heal_val": {"0.0": 4.0, "0.01": 3.9}}]
        recs = [r for r in recs if r["stage"] in stages]
        spec = {"model": "tiny", "tie": tie, "layers": "all", "version": version, **OLD_SIZES, **OLD_HEALED}
        store.measure("tie_cost", spec, lambda r=recs: r)


def _rendered(data, tmp_path):
    fig = fig_q3_tie_layers(data, tmp_path)
    return (tables.tie_cost_blocks(data),
            tie_cost_sentence(data, ("kv", "gqa")), tie_cost_sentence(data, ("qk", "qkv")),
            None if fig is None else (tmp_path / fig.csv).read_text())


def test_old_healed_records_are_ignored(tmp_path, profile):
    """A store from before healing moved to ``qkvlab convert`` (issue 38): its version-4 records,
    healed ones among them, change nothing in the table, the sentences or the figure; nor does a
    "healed" record stamped with the current version."""
    p, _ = profile
    _, _, data = _run(tmp_path, p)
    want = _rendered(data, tmp_path)
    with Store(tmp_path / "r.db") as store:
        _old_records(store, version=4)
        _old_records(store, version=cost.VERSION, stages=("healed",))  # past the version check
        data = results.load(store, p)
    assert (data.measure("tie_cost").stage == "healed").sum() == 4
    assert _rendered(data, tmp_path) == want
    assert set(tie_costs(data).stage) == {"zero-shot", "refused"}


def test_a_store_of_old_healed_records_only_renders_as_not_measured(tmp_path):
    """Only version-4 records (zero-shot and healed), the profile measuring none: nothing is
    shown, and the table says so, instead of failing on the heal fields."""
    with Store(tmp_path / "r.db") as store:
        _old_records(store, version=4)
        data = results.load(store, get_profile("smoke"))
    assert tie_costs(data).empty
    assert _rendered(data, tmp_path) == (
        [Para("What a tie would cost a trained model: not measured in this store at this profile's sizes; "
              "`qkvlab tiecost smollm2` stores it.", note=True)], "", "", None)


def test_a_model_not_fetched_is_a_note(tmp_path, monkeypatch):
    monkeypatch.setenv("QKVLAB_ZOO", str(tmp_path / "empty"))
    p = dataclasses.replace(get_profile("smoke"), tie_cost=CFG, tie_cost_models=("gemma3-270m",))
    monkeypatch.setattr(study, "get_profile", lambda name: p)
    cfg = study.StudyConfig(profile="smoke", db=str(tmp_path / "r.db"), pretrained=())
    with Store(cfg.db) as store:
        rec = study.Recorder(store, "smoke")
        study.run_tie_cost(rec, cfg)
        assert store.measure_rows("tie_cost") == []
    (note,) = rec.notes
    assert note.startswith("tie_cost (gemma3-270m):") and "qkvlab zoo fetch gemma3-270m" in note


def test_perplexity_texts():
    assert [ppl_text(x) for x in (20.98, 129.17, 12289.33, 100934.19)] == ["20.98", "129.2", "12,289", "100,934"]
    assert ([ppl_change(p) for p in (-0.68, 64.2, 99.4, 516.0, 46394.0, 379305.0)]
            == ["-1%", "+64%", "+99%", "×6.16", "×465", "×3,794"])
