"""Issue 41, item 5: no damaged model gets a number. ``load_lm`` (``qkvlab tiecost`` and
``qkvlab convert``) let transformers fill what a file lacked with random weights and measured
the result; now a file that does not fill the model its config describes, or holds a NaN or an
infinity, ends in one ``InputFileError`` naming the file and the first tensors. (``qkvlab
analyze``'s side is in ``test_analysis_bad_input.py``.) Each test writes its own tiny model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import fuzz_formats
from qkvlab.inputs import InputFileError

pytest.importorskip("transformers")

FILL = "the weights do not fill the LlamaForCausalLM its config describes; "
RANDOM = "missing from the file (transformers would initialize them at random)"


def tiny_hf_llama(folder: Path) -> Path:
    """A random two-layer Llama saved by transformers, with a word-level tokenizer: an honest
    folder ``load_lm`` reads (tied embeddings, so ``lm_head.weight`` is not stored)."""
    import torch
    import transformers
    from tokenizers import Tokenizer, models, pre_tokenizers

    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32,
                                   num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2, max_position_embeddings=64,
                                   tie_word_embeddings=True)
    transformers.LlamaForCausalLM(cfg).save_pretrained(folder)
    tok = Tokenizer(models.WordLevel({f"w{i}": i for i in range(32)}, unk_token="w0"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    transformers.PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="w0").save_pretrained(folder)
    return folder


def damage(folder: Path, tensors=None, config=None) -> Path:
    """Apply ``tensors(state dict)`` to the folder's safetensors, ``config(dict)`` to its config."""
    from safetensors.torch import load_file, save_file

    if tensors:
        sd = load_file(folder / "model.safetensors")
        tensors(sd)
        save_file(sd, folder / "model.safetensors", metadata={"format": "pt"})
    if config:
        cfg = json.loads((folder / "config.json").read_text())
        config(cfg)
        (folder / "config.json").write_text(json.dumps(cfg))
    return folder


def test_an_honest_hf_folder_loads_with_every_tensor_from_its_file(tmp_path):
    from safetensors.torch import load_file

    from qkvlab.hf.cost import load_lm

    folder = tiny_hf_llama(tmp_path / "m")
    model, tok = load_lm(str(folder))
    stored, got = load_file(folder / "model.safetensors"), model.state_dict()
    assert sorted(stored) == sorted(k for k in got if k != "lm_head.weight")
    assert [k for k in stored if not got[k].equal(stored[k])] == []
    assert model.lm_head.weight is model.model.embed_tokens.weight
    assert tok("w3 w5")["input_ids"] == [3, 5]


def _set(sd: dict, key: str, index, value: float) -> None:
    sd[key][index] = value


@pytest.mark.parametrize("tensors, config, said", [
    (lambda sd: sd.pop("model.layers.1.self_attn.v_proj.weight"), None,
     f"{FILL}1 tensor {RANDOM}: model.layers.1.self_attn.v_proj.weight (refused)"),
    (None, lambda c: c.update(num_hidden_layers=3), "config.json says num_hidden_layers = 3, "
                                                    "but the weight files hold 2 layers (refused)"),
    (None, lambda c: c.update(num_hidden_layers=4000), "config.json says num_hidden_layers = "
                                                       "4,000, but the weight files hold 2 layers "
                                                       "(refused)"),
    (None, lambda c: c.update(model_type="qwen2", architectures=["Qwen2ForCausalLM"]),
     f"the weights do not fill the Qwen2ForCausalLM its config describes; 6 tensors {RANDOM}: "
     "model.layers.0.self_attn.k_proj.bias, model.layers.0.self_attn.q_proj.bias, "
     "model.layers.0.self_attn.v_proj.bias, and 3 more (refused)"),
    (lambda sd: sd.update({"model.layers.0.self_attn.extra.weight":
                           sd["model.norm.weight"].clone()}),
     None, f"{FILL}1 tensor in the file but not in the model: "
           "model.layers.0.self_attn.extra.weight (refused)"),
    (lambda sd: sd.update({"model.layers.0.self_attn.q_proj.weight":
                           sd["model.layers.0.self_attn.k_proj.weight"].clone()}), None,
     f"{FILL}1 tensor of the wrong shape: model.layers.0.self_attn.q_proj.weight (shape (8, 16) "
     "in the file, (16, 16) in the model) (refused)"),
    (lambda sd: _set(sd, "model.layers.0.self_attn.q_proj.weight", (2, 7), float("nan")), None,
     "tensor model.layers.0.self_attn.q_proj.weight is not finite (1 NaN and 0 infinite of 256 "
     "values, the first at index [2, 7]); the weights are damaged (refused)"),
    (lambda sd: _set(sd, "model.norm.weight", 4, float("-inf")), None,
     "tensor model.norm.weight is not finite (0 NaN and 1 infinite of 16 values, the first at "
     "index [4]); the weights are damaged (refused)"),
], ids=["missing-v_proj", "one-layer-too-many", "4000-layers", "relabelled-qwen2", "unexpected", "wrong-shape",
        "nan-in-q_proj", "inf-in-norm"])
def test_a_damaged_hf_folder_is_refused_by_load_lm_in_one_line(tmp_path, caplog, tensors,
                                                                  config, said):
    from qkvlab.hf.cost import load_lm

    folder = damage(tiny_hf_llama(tmp_path / "m"), tensors, config)
    with pytest.raises(InputFileError) as e:
        load_lm(str(folder))
    assert str(e.value) == f"{folder}: {said}"
    assert "LOAD REPORT" not in caplog.text  # transformers' table of the same keys is held back


@pytest.mark.parametrize("edit, said", [
    (lambda m, t: ([(k, ty, v + 1 if k == "llama.block_count" else v) for k, ty, v in m], t),
     "GGUF block_count = 3, but the tensors hold blocks 0-1 (2)"),
    (lambda m, t: (m, [x for x in t if x[0] != "blk.1.attn_v.weight"]),
     "block 1 lacks blk.1.attn_v.weight"),
], ids=["block_count-one-too-many", "attn_v-missing"])
def test_a_gguf_that_does_not_fill_its_model_is_refused_by_load_lm(tmp_path, edit, said):
    """Refused as ``analyze`` refuses them (one set of checks, ``open_gguf``), before
    transformers fills the gaps at random (its load report refused them after, as a last
    line)."""
    from qkvlab.hf.cost import load_lm

    path = tmp_path / "m.gguf"
    path.write_bytes(fuzz_formats.gguf_bytes(*edit(*fuzz_formats.gguf_seed())))
    with pytest.raises(InputFileError) as e:
        load_lm(str(path))
    assert str(e.value) == f"{path}: {said}"


@pytest.mark.parametrize("meta, infos, said", [
    ([("tokenizer.ggml.bos_token_id", 4, 12)], None,
     "tokenizer.ggml.bos_token_id = 12 is not a token id: the vocabulary (tokenizer.ggml.tokens) "
     "holds 12 tokens (ids 0 to 11)"),
    ([("tokenizer.ggml.eos_token_id", 5, -1)], None,
     "tokenizer.ggml.eos_token_id = -1 is not a token id: the vocabulary (tokenizer.ggml.tokens) "
     "holds 12 tokens (ids 0 to 11)"),
    ([], {"blk.0.attn_q.weight": {"offset": 352}},
     "the data of GGUF tensor 'blk.0.attn_q.weight' (256 bytes at offset 352) overlaps that of "
     "tensor 'token_embd.weight' (384 bytes at offset 0)"),
], ids=["bos-out-of-range", "eos-negative", "overlapping-data"])
def test_load_lm_walks_a_gguf_header_as_analyze_does_before_transformers(tmp_path, meta, infos,
                                                                         said):
    """``tiecost`` and ``convert`` met these as an IndexError in transformers' tokenizer, a
    model with a token id -1, and a model read from overlapping bytes; ``analyze`` refused them.
    Now one header walk (``analysis._gguf.check_gguf``) serves all three."""
    from qkvlab.hf.cost import load_lm

    m, t = fuzz_formats.gguf_seed()
    path = tmp_path / "m.gguf"
    path.write_bytes(fuzz_formats.gguf_bytes(m + meta, t, infos=infos))
    with pytest.raises(InputFileError) as e:
        load_lm(str(path))
    assert str(e.value) == f"{path}: {said}"
