"""Hugging Face models with a Q/K/V tie imposed, and what the tie costs them on held-out text.

``tie(model, "kv" | "qk" | "qkv" | "gqa", calibration=token_ids)`` returns the model with the
tie fitted on real activations and imposed by sharing Parameters in the transformers modules,
so it trains on with ordinary HF code. ``qkvlab.hf.cost.measure_tie_cost`` measures held-out
perplexity before and after (``qkvlab tiecost``). ``qkvlab.hf.decode.generate(model, ids, n)``
decodes such a model with one cache tensor (the pre-rotary k) per K=V layer.
"""

from qkvlab.hf.tie import KINDS, Calibration, SharedQuery, TieError, calibrate, tie

__all__ = ["KINDS", "Calibration", "SharedQuery", "TieError", "calibrate", "tie"]
