"""Models built from attention designs: decoder LM, encoder (MLM), encoder-decoder."""

from qkvlab.models.blocks import Block, Rotary
from qkvlab.models.config import ROLES, ModelConfig
from qkvlab.models.convert import from_hf_gpt2
from qkvlab.models.encoder import Encoder, EncoderDecoder
from qkvlab.models.fold import fold_alt, fold_attention
from qkvlab.models.io import KINDS, build_model, load_model, read_metadata, save_model
from qkvlab.models.lm import DecoderLM
from qkvlab.models.params import config_params, count_params, match_params

__all__ = ["Block", "DecoderLM", "from_hf_gpt2", "Encoder", "EncoderDecoder", "KINDS",
           "ModelConfig",
           "ROLES", "Rotary", "build_model", "config_params", "count_params", "fold_alt",
           "fold_attention", "load_model", "match_params", "read_metadata", "save_model"]
