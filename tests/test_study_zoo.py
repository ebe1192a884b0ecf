"""Q2's zoo view: the table and figure CSV from stored ``pretrained`` measures, the published
medians matched one to one (same checkpoint) or by family, the sentences, the profile's model
list, and a model not fetched becoming a note."""

import numpy as np
import pandas as pd
import pytest

from qkvlab.analysis.zoo import load_manifest
from qkvlab.experiments.store import Store
from qkvlab.studies.qkv import study
from qkvlab.studies.qkv.compute import results
from qkvlab.studies.qkv.plan import references as R
from qkvlab.studies.qkv.render.figures_zoo import fig_q2_zoo
from qkvlab.studies.qkv.compute.zoo import MEASURES, zoo_table
from qkvlab.studies.qkv.render.pretrained import decoders_vs_published, large_heads

MODELS = {"minilm": ["encoder"], "whisper-tiny": ["encoder", "cross"],
          "qwen2.5-coder-1.5b": ["decoder"], "smollm2": ["decoder"]}
MEDIAN = MEASURES.index("symmetry_layer_median")


def _value(i: int, j: int, k: int) -> dict:
    """Distinct toy numbers for model i, role j, measure k."""
    mean = 0.1 * i + 0.03 * j + 0.01 * k
    return {"mean": mean, "std": 0.01, "null_mean": mean / 10, "null_std": 0.002,
            "null_lo": mean / 10 - 0.004, "null_hi": mean / 10 + 0.004,
            "share_above_null": 0.5 + 0.1 * j, "n_heads": 12 * (i + 1)}


def _records(i: int, roles: list[str]) -> list[dict]:
    out = [{"level": "summary", "role": r, "measure": m, **_value(i, j, k)}
           for j, r in enumerate(roles) for k, m in enumerate(MEASURES)]
    out.append({"level": "summary", "role": roles[0], "measure": "cka", **_value(i, 0, 9)})
    return out + [{"level": "layer", "role": roles[0], "layer": 0, "measure": "symmetry",
                   "value": 0.5}]


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    with Store(tmp_path_factory.mktemp("store") / "r.db") as store:
        for i, (name, roles) in enumerate(MODELS.items()):
            store.measure("pretrained", {"profile": "smoke", "source": name},
                          lambda i=i, roles=roles: _records(i, roles))
        return results.load(store, "smoke")


def _expected() -> pd.DataFrame:
    zoo = load_manifest()
    published = {("minilm", "encoder"): 0.51, ("whisper-tiny", "encoder"): 0.504,
                 ("smollm2", "decoder"): 0.12}  # BERT-base, Whisper-tiny enc, Llama-2-7B
    rows = []
    for i, (name, roles) in enumerate(MODELS.items()):
        for j, r in enumerate(roles):
            for k, m in enumerate(MEASURES):
                v = _value(i, j, k)
                pub = published.get((name, r)) if m == "symmetry_layer_median" else None
                rows.append({"model": name, "role": r, "params": zoo[name].params,
                             "measure": m, **{c: v[c] for c in ("mean", "null_mean", "null_lo",
                                                                 "null_hi", "n_heads")},
                             "published": np.nan if pub is None else pub})
    return (pd.DataFrame(rows).sort_values(["params", "model", "role"], kind="stable")
            .reset_index(drop=True))


def test_figure_csv_is_the_stored_measures(data, tmp_path):
    fig = fig_q2_zoo(data, tmp_path)
    assert fig is not None and (tmp_path / fig.png).stat().st_size > 0
    got = pd.read_csv(tmp_path / fig.csv)
    want = _expected()
    assert got.model.tolist() == want.model.tolist()
    assert got.role.tolist() == want.role.tolist() and got.measure.tolist() == want.measure.tolist()
    num = ["params", "mean", "null_mean", "null_lo", "null_hi", "n_heads", "published"]
    np.testing.assert_allclose(got[num].to_numpy(float), want[num].to_numpy(float), rtol=1e-12)
    assert set(got.family) == {"bert", "whisper", "qwen2", "llama"}
    pub = got[got.published.notna()]
    assert pub.published_match.tolist() == ["same family"] * 3  # no zoo model is theirs
    assert pub.published_model.tolist() == ["BERT-base", "Whisper-tiny encoder", "Llama-2-7B"]
    assert (pub.measure == "symmetry_layer_median").all()


def test_large_heads_sentence(data):
    s = large_heads(data)
    v = {k: _value(2, 0, k) for k in range(len(MEASURES))}
    sym = v[MEASURES.index("symmetry")]
    assert "128×128" in s and "Qwen2.5-Coder-1.5B" in s and "36 d_head" in s
    assert f"s = {sym['mean']:.3f}" in s and f"{sym['null_mean']:+.3f} ± 0.002" in s
    med = v[MEDIAN]
    assert f"whole layer, median over layers {med['mean']:.3f} (null {med['null_mean']:.3f})" in s
    lay = v[MEASURES.index("symmetry_layer")]
    assert f"whole layer, mean {lay['mean']:.3f}" in s
    assert "50% of them" in s
    assert "published" not in s and "Llama-3" not in s  # Qwen2: nothing of its family published


def test_decoders_against_the_published_values(data):
    s = decoders_vs_published(data)
    dec, smol = _value(2, 0, MEDIAN), _value(3, 0, MEDIAN)
    assert "median over layers (the statistic published by Saponati et al. 2025" in s
    assert f"SmolLM2-135M-Instruct {smol['mean']:.3f} (published Llama-2-7B 0.12, same family)" in s
    assert f"Qwen2.5-Coder-1.5B-Instruct {dec['mean']:.3f} (published" not in s  # none
    assert f"Qwen2.5-Coder-1.5B-Instruct {dec['mean']:.3f}" in s
    assert f"random nulls ≤ {smol['null_hi']:.3f}; every one above" in s
    enc = [_value(0, 0, MEDIAN)["mean"], _value(1, 0, MEDIAN)["mean"]]  # minilm, whisper enc
    assert f"encoders range {min(enc):.2f}–{max(enc):.2f}" in s
    assert ("Published causal decoders, same statistic: GPT-2 0.15 (124 M parameters, full "
            "multi-head attention), Llama-2-7B 0.12 (7 B parameters") in s
    assert "h mod n_kv instead of h // n_rep" in s and "without loading weights" in s
    assert "stops at 1.8 B parameters" in s and "below every encoder's" not in s


def test_same_checkpoint_is_named_so(data, monkeypatch):
    """Were the zoo's whisper-tiny their checkpoint, its row would say so, and the exact match
    wins over the family's."""
    exact = R.PublishedSymmetry("Whisper-tiny.en encoder", "openai/whisper-tiny.en", "encoder",
                                0.4, "x.pkl", zoo="whisper-tiny")
    monkeypatch.setattr(R, "PUBLISHED_SYMMETRY_ROWS", (*R.PUBLISHED_SYMMETRY_ROWS, exact))
    df = zoo_table(data)
    row = df[(df.model == "whisper-tiny") & (df.role == "encoder")
             & (df.measure == "symmetry_layer_median")].iloc[0]
    assert (row.published_model, row.published, row.published_match,
            row.published_checkpoint) == (exact.name, 0.4, "same checkpoint", exact.checkpoint)
    other = df[(df.model == "minilm") & (df.measure == "symmetry_layer_median")].iloc[0]
    assert other.published_match == "same family"


def test_q2_verdict_and_table_pair_medians_one_to_one(data):
    from qkvlab.report.blocks import Table
    from qkvlab.studies.qkv.render import page, verdicts
    (sym,) = [d for d in verdicts.verdict_q2(data).details if d.startswith("Symmetry s of W_QK")]
    smol = _value(3, 0, MEDIAN)
    assert (f"smollm2 decoder: whole layer, median over layers {smol['mean']:.2f} "
            f"(null {smol['null_mean']:+.3f}), whole layer, mean over layers") in sym
    assert ("Beside the published medians over layers, one to one (reference values, not "
            "measured here; Saponati et al. 2025, arXiv:2502.10927): ") in sym
    assert (f"smollm2 decoder {smol['mean']:.3f} against Llama-2-7B 0.12, same family "
            f"(meta-llama/Llama-2-7b-hf)") in sym
    assert f"whisper-tiny encoder {_value(1, 0, MEDIAN)['mean']:.3f} against Whisper-tiny " \
           f"encoder 0.504, same family (openai/whisper-tiny)" in sym
    assert "qwen2.5-coder-1.5b decoder 0.200 against" not in sym and "Llama-3" not in sym
    (table,) = [b for b in page.q2_blocks(data) if isinstance(b, Table)
                and "published median" in b.headers]
    cells = {(r[0], r[1]): r[-1] for r in table.rows}
    assert cells[("smollm2", "decoder")] == "Llama-2-7B 0.12, same family (meta-llama/Llama-2-7b-hf)"
    assert cells[("whisper-tiny", "cross")] == "—" and cells[("qwen2.5-coder-1.5b", "decoder")] == "—"


def test_empty_without_zoo_measures(tmp_path):
    with Store(tmp_path / "r.db") as store:
        d = results.load(store, "smoke")
    assert zoo_table(d).empty and large_heads(d) == "" and fig_q2_zoo(d, tmp_path) is None
    assert decoders_vs_published(d) == ""


def test_profile_picks_the_models():
    assert study.StudyConfig(profile="quick").pretrained == study.PRETRAINED
    assert set(study.PRETRAINED) == {"minilm", "whisper-tiny", "smollm2"}
    assert study.StudyConfig(profile="full").pretrained == tuple(load_manifest())
    assert study.StudyConfig(profile="full", pretrained=()).pretrained == ()
    with pytest.raises(ValueError, match="pretrained: 'gpt5' is not one of"):
        study.StudyConfig(profile="quick", pretrained=("gpt5",))


def test_model_not_fetched_is_a_note(tmp_path, monkeypatch):
    monkeypatch.setenv("QKVLAB_ZOO", str(tmp_path / "empty"))
    cfg = study.StudyConfig(profile="smoke", db=str(tmp_path / "r.db"),
                            pretrained=("qwen2.5-coder-1.5b",))
    with Store(cfg.db) as store:
        rec = study.Recorder(store, "smoke")
        study.run_pretrained(rec, cfg)
    (note,) = rec.notes
    assert note.startswith("pretrained (") and "qkvlab zoo fetch qwen2.5-coder-1.5b" in note
