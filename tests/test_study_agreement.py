"""Two reports' verdicts cell by cell (``compute.agreement``, ``qkvlab study --agree``)."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from qkvlab.cli import main
from qkvlab.experiments.store import Store
from qkvlab.studies.qkv.compute import results
from qkvlab.studies.qkv.compute.agreement import (
    CSV,
    Relation,
    agreement,
    read_verdicts,
    relation,
    with_verdicts,
)
from qkvlab.studies.qkv.compute.effects import effect
from test_study_verdicts import STD, TIED, _fill


def _verdicts(tmp_path) -> pd.DataFrame:
    with Store(tmp_path / "r.db") as store:
        _fill(store, "lm_tied_kv", "lm", {("standard", "equal"): STD, ("standard", "matched"): STD,
                                          ("tied_kv", "equal"): TIED,
                                          ("tied_kv", "matched"): [2.0, 2.2, 2.1]})
        data = results.load(store, "smoke")
    return data, with_verdicts(data)


def test_each_row_carries_the_verdict_the_report_words(tmp_path):
    data, df = _verdicts(tmp_path)
    assert len(df) == len(data.comparisons) > 0
    for r in df.to_dict("records"):
        own = r["metric"] == "val_loss"  # lm's own metric: its chance level applies
        e = effect(r, chance=results.row_chance(r, data.profile) if own else None)
        got = (r["verdict"], r["raw_verdict"], r["effect"], r["effect_half"], r["effect_unit"])
        want = (e.status.value, (e.raw_status or e.status).value, e.value, e.half, e.unit)
        # a frame holds NaN where the effect has None (no value to quote)
        assert [None if isinstance(g, float) and math.isnan(g) else g for g in got] \
            == list(want)
    tied = df[(df.design == "tied_kv") & (df.metric == "val_loss")]
    assert dict(zip(tied.arm, tied.verdict)) == {"equal": "worse", "matched": "undecided"}


def test_relation_of_every_pair_of_verdicts():
    assert relation("worse", "worse") is Relation.AGREE
    assert relation("equivalent", "equivalent") is Relation.AGREE
    assert relation("worse", "better") is Relation.CONTRADICT
    assert relation("equivalent", "worse") is Relation.CONTRADICT
    assert relation("worse", "undecided") is Relation.ONLY_A
    assert relation("attention_unused", "better") is Relation.ONLY_B
    assert relation("not_learned", "undecided") is Relation.NEITHER


def test_cells_pair_on_their_tags_whatever_the_file_wrote(tmp_path):
    a = pd.DataFrame({"experiment": ["e"] * 4, "task": ["lm"] * 4, "metric": ["val_loss"] * 4,
                      "d_head": [16.0, 64.0, 256.0, float("nan")],
                      "design": ["x", "x", "x", "y"],
                      "verdict": ["worse", "better", "undecided", "equivalent"],
                      "effect": [1.0, -1.0, 0.0, 0.1]})
    b = pd.DataFrame({"experiment": ["e"] * 4, "task": ["lm"] * 4, "metric": ["val_loss"] * 4,
                      "d_head": ["16", 64, 256, None],  # as another reader typed them
                      "design": ["x", "x", "x", "y"],
                      "verdict": ["worse", "worse", "equivalent", "attention_unused"],
                      "effect": [1.0, 1.0, 0.0, 0.1]})
    got = agreement(a, b)
    assert got[["d_head", "design", "relation"]].values.tolist() == [
        ["64", "x", "contradicts"],  # contradictions first
        ["", "y", "only A decides"],
        ["256", "x", "only B decides"],
        ["16", "x", "agree"]]
    assert got.effect_a.tolist() == [-1.0, 0.1, 0.0, 1.0]
    assert agreement(a, b.assign(task="mlm")).empty  # a cell only one report holds is left out
    # throughput is the machine's: its verdicts are not compared
    assert agreement(a.assign(metric="tokens_per_s"), b.assign(metric="tokens_per_s")).empty


def test_agree_command_exits_1_on_a_contradiction(tmp_path, capsys):
    _, df = _verdicts(tmp_path)
    for name, frame in (("a", df), ("b", df.assign(verdict=df.verdict.replace("worse", "better"))),
                        ("same", df)):
        (tmp_path / name).mkdir()
        frame.to_csv(tmp_path / name / CSV, index=False)
    assert read_verdicts(tmp_path / "a").verdict.tolist() == df.verdict.tolist()
    assert main(["study", "--agree", str(tmp_path / "a"), str(tmp_path / "same")]) == 0
    out = capsys.readouterr().out
    a, same = tmp_path / "a", tmp_path / "same"
    assert out.splitlines()[-1] == (f"0 contradicts; 0 only {a} decides; 0 only {same} decides; "
                                    f"1 agree; 1 neither decides (of 2 cells both reports hold)")
    row = [ln for ln in out.splitlines() if "| val_loss | equal | tied_kv |" in ln]
    e = df[(df.arm == "equal") & (df.design == "tied_kv") & (df.metric == "val_loss")].iloc[0]
    assert len(row) == 1 and f"worse {e.effect:+.3g} ± {e.effect_half:.3g}%" in row[0]
    assert math.isfinite(e.effect)
    assert main(["study", "--agree", str(tmp_path / "a"), str(tmp_path / "b")]) == 1
    out = capsys.readouterr().out
    assert out.index("contradicts") < out.index("1 contradicts")
    assert "1 contradicts" in out


def test_agree_names_a_missing_or_old_report(tmp_path, capsys):
    with pytest.raises(ValueError, match="no such file"):
        read_verdicts(tmp_path)
    pd.DataFrame({"experiment": ["e"], "task": ["lm"], "metric": ["val_loss"]}).to_csv(
        tmp_path / CSV, index=False)
    with pytest.raises(ValueError, match="no column verdict; write the report again"):
        read_verdicts(tmp_path)
    assert main(["study", "--agree", str(tmp_path), str(tmp_path / "none")]) == 2
    assert "no column verdict" in capsys.readouterr().err
