"""Attention designs: registry, shared module, kernel, KV cache, circuits, and the linear layer
every model uses (few-row products on the faster CPU kernel)."""

from qkvlab.attention.base import Attention
from qkvlab.attention.circuits import FactoredMatrix
from qkvlab.attention.config import SCALES, AttentionConfig
from qkvlab.attention.core import KVCache, repeat_kv
from qkvlab.attention.gemv import Linear, decode_kernel, linear, set_gemv_kernel
from qkvlab.attention.registry import DESIGNS, build_attention, register
from qkvlab.attention import designs as _designs  # noqa: F401  (registers the designs)

__all__ = ["Attention", "AttentionConfig", "DESIGNS", "FactoredMatrix", "KVCache", "Linear",
           "SCALES", "build_attention", "decode_kernel", "linear", "register", "repeat_kv",
           "set_gemv_kernel"]
