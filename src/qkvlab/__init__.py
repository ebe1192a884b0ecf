"""qkvlab: why attention is softmax(QKᵀ/√d_k)·V, answered with working software."""

from qkvlab.attention import DESIGNS, Attention, AttentionConfig, FactoredMatrix, KVCache

__version__ = "0.1.0"
__all__ = ["DESIGNS", "Attention", "AttentionConfig", "FactoredMatrix", "KVCache", "__version__"]
