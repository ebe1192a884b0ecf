"""qkvlab: why attention is softmax(QKᵀ/√d_k)·V, answered with working software."""

from qkvlab.attention import DESIGNS, Attention, AttentionConfig, FactoredMatrix, KVCache
from qkvlab.models import (DecoderLM, Encoder, EncoderDecoder, ModelConfig, build_model,
                           count_params, fold_alt, load_model, match_params, save_model)

__version__ = "0.1.0"
__all__ = ["DESIGNS", "Attention", "AttentionConfig", "DecoderLM", "Encoder", "EncoderDecoder",
           "FactoredMatrix", "KVCache", "ModelConfig", "__version__", "build_model",
           "count_params", "fold_alt", "load_model", "match_params", "save_model"]
