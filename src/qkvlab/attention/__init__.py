"""Attention designs: the object of study. Registry, shared module, SDPA core, KV cache,
circuits."""

from qkvlab.attention.base import Attention
from qkvlab.attention.circuits import FactoredMatrix
from qkvlab.attention.config import SCALES, AttentionConfig
from qkvlab.attention.core import KVCache, repeat_kv
from qkvlab.attention.registry import DESIGNS, build_attention, register
from qkvlab.attention.view import LayerView
from qkvlab.attention import designs as _designs  # noqa: F401  (registers the designs)

__all__ = ["Attention", "AttentionConfig", "DESIGNS", "FactoredMatrix", "KVCache", "LayerView",
           "SCALES", "build_attention", "register", "repeat_kv"]
