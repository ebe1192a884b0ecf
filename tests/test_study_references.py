"""The published numbers: Kayyam et al.'s table in its unit, Saponati et al.'s medians as rows
that agree with the library's list, and the one-to-one / same-family match."""

from __future__ import annotations

import pytest

from qkvlab.analysis.measures import PUBLISHED_STATISTIC, PUBLISHED_SYMMETRY
from qkvlab.analysis.zoo import load_manifest
from qkvlab.studies.qkv.plan import references as R


def test_kayyam_table_in_its_unit():
    ppl, pct = R.KAYYAM_300M_PPL, R.KAYYAM_300M_PCT
    assert ppl == {"QKV": 5.11, "GQA-4": 5.15, "MQA": 5.19, "Q–K=V": 5.27, "Q=K–V": 5.36,
                   "Q=K=V": 6.41}
    assert pct == {"GQA-4": 0.7, "MQA": 1.5, "Q–K=V": 3.1, "Q=K–V": 4.8, "Q=K=V": 25.4}
    # the published % come from unrounded perplexities: within 0.15 point of the rounded ratio
    for k, v in pct.items():
        assert abs(100 * (ppl[k] / ppl["QKV"] - 1) - v) < 0.15, k
    assert R.REF_KV_PPL_PCT == 3.1 and R.KAYYAM_1B2_KV_PCT == 2.48
    assert "per subword token" in R.KAYYAM_UNIT and "EOS padding" in R.KAYYAM_UNIT


def test_saponati_rows_agree_with_the_library():
    rows = {p.name: p.value for p in R.PUBLISHED_SYMMETRY_ROWS}
    assert rows == {"BERT-base": 0.51, "GPT-2": 0.150, "Llama-2-7B": 0.12, "DINOv2-small": 0.486,
                    "Whisper-tiny encoder": 0.504, "Whisper-tiny decoder": 0.170}
    assert all(PUBLISHED_SYMMETRY[k] == v for k, v in rows.items())
    assert R.SAPONATI_MEASURE == PUBLISHED_STATISTIC == "symmetry_layer_median"
    assert not any(k.startswith(("Llama-3", "Mistral")) for k in PUBLISHED_SYMMETRY)
    zoo = load_manifest()
    for p in R.PUBLISHED_SYMMETRY_ROWS:  # every match names a real zoo model or family
        assert p.zoo is None or p.zoo in zoo
        assert set(p.families) <= {m.family for m in zoo.values()}


@pytest.mark.parametrize(("model", "family", "role", "want"), [
    ("minilm", "bert", "encoder", ("BERT-base", R.SAME_FAMILY)),
    ("whisper-tiny", "whisper", "encoder", ("Whisper-tiny encoder", R.SAME_FAMILY)),
    ("whisper-tiny", "whisper", "decoder", ("Whisper-tiny decoder", R.SAME_FAMILY)),
    ("whisper-tiny", "whisper", "cross", None),
    ("smollm2", "llama", "decoder", ("Llama-2-7B", R.SAME_FAMILY)),
    ("dinov2-s", "vit", "encoder", ("DINOv2-small", R.SAME_FAMILY)),
    ("qwen2.5-coder-1.5b", "qwen2", "decoder", None),
    ("mpnet", "mpnet", "encoder", None),
])
def test_published_match(model, family, role, want):
    got = R.published_match(model, family, role)
    assert (None if got is None else (got[0].name, got[1])) == want


def test_same_checkpoint_wins_over_family(monkeypatch):
    exact = R.PublishedSymmetry("SmolLM2-135M", "HuggingFaceTB/SmolLM2-135M", "decoder", 0.2,
                                "x.pkl", zoo="smollm2")
    monkeypatch.setattr(R, "PUBLISHED_SYMMETRY_ROWS", (*R.PUBLISHED_SYMMETRY_ROWS, exact))
    assert R.published_match("smollm2", "llama", "decoder") == (exact, R.SAME_CHECKPOINT)
    assert R.published_match("other", "llama", "decoder")[1] == R.SAME_FAMILY
    assert R.published_match("smollm2", "llama", "encoder") is None
