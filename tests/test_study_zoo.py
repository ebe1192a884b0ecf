"""Q2's zoo view: the table and figure CSV from stored ``pretrained`` measures, the sentence on
d_head ≥ 100 heads, the profile's model list, and a model not fetched becoming a note."""

import numpy as np
import pandas as pd
import pytest

from qkvlab.analysis.measures import PUBLISHED_SYMMETRY
from qkvlab.analysis.zoo import load_manifest
from qkvlab.experiments.store import Store
from qkvlab.studies.qkv import study
from qkvlab.studies.qkv.compute import results
from qkvlab.studies.qkv.render.figures_zoo import fig_q2_zoo
from qkvlab.studies.qkv.compute.zoo import MEASURES, zoo_table
from qkvlab.studies.qkv.render.pretrained import decoders_vs_published, large_heads

MODELS = {"minilm": ["encoder"], "whisper-tiny": ["encoder", "cross"],
          "qwen2.5-coder-1.5b": ["decoder"]}


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
    published = {("minilm", "encoder"): PUBLISHED_SYMMETRY["BERT-base"],
                 ("qwen2.5-coder-1.5b", "decoder"): PUBLISHED_SYMMETRY["Llama-3-8B"]}
    rows = []
    for i, (name, roles) in enumerate(MODELS.items()):
        for j, r in enumerate(roles):
            for k, m in enumerate(MEASURES):
                v = _value(i, j, k)
                pub = published.get((name, r)) if m == "symmetry_layer" else None
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
    assert set(got.family) == {"bert", "whisper", "qwen2"}


def test_large_heads_sentence(data):
    s = large_heads(data)
    v = {k: _value(2, 0, k) for k in range(len(MEASURES))}
    sym = v[MEASURES.index("symmetry")]
    assert "128×128" in s and "Qwen2.5-Coder-1.5B" in s and "36 d_head" in s
    assert f"s = {sym['mean']:.3f}" in s and f"{sym['null_mean']:+.3f} ± 0.002" in s
    assert f"whole layer {v[0]['mean']:.3f} (null {v[0]['null_mean']:.3f})" in s
    assert "Llama-3-8B" in s and "50% of them" in s


def test_decoders_against_the_published_values(data):
    s = decoders_vs_published(data)
    dec = _value(2, 0, MEASURES.index("symmetry_layer"))
    assert f"Qwen2.5-Coder-1.5B-Instruct {dec['mean']:.3f}" in s
    assert f"random nulls ≤ {dec['null_hi']:.3f}; every one above" in s
    enc = [_value(0, 0, 0)["mean"], _value(1, 0, 0)["mean"]]  # minilm, whisper-tiny encoder
    assert f"encoders range {min(enc):.2f}–{max(enc):.2f}" in s
    assert "GPT-2's published 0.15" in s and "Llama-3-8B 0.00, Mistral-7B 0.00" in s
    assert "stops at 1.8 B parameters" in s and "below every encoder's" not in s  # 0.2 > 0.0


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
