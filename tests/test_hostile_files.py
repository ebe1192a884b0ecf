"""Hostile and careless input files, one test per finding: a tiny file cannot make qkvlab
allocate gigabytes (1); header values end in one ``InputFileError`` naming the file, not a
traceback (2); the command line prints one line, after any progress bar, and keeps the
traceback of an unexpected failure behind ``--debug`` (2, 5); ``qkvlab analyze`` reads the
ONNX and Marian files the README lists, given by path (6)."""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest

import fuzz_formats
from qkvlab.analysis import resolve
from qkvlab.analysis.sources import SUPPORTED
from qkvlab.inputs import InputFileError
from qkvlab.models import load_model

TESTS = Path(__file__).resolve().parent


def metadata_only_checkpoint(path: Path, **cfg) -> Path:
    """A qkvlab safetensors checkpoint of no tensors whose metadata claims ``cfg``."""
    meta = {"qkvlab_kind": "decoder", "qkvlab_config": json.dumps({"d_vocab": 11, "n_ctx": 8, **cfg})}
    head = json.dumps({"__metadata__": meta}).encode()
    head += b" " * (-len(head) % 8)
    path.write_bytes(struct.pack("<Q", len(head)) + head)
    return path


# ---- 1: a 248-byte file took 16 GB ---------------------------------------------------------------
@pytest.mark.parametrize("cfg, words", [({"d_vocab": 10**9}, "d_vocab: 1,000,000,000 is above"),
                                        ({"n_layers": 100_000}, "n_layers: 100,000 is above"),
                                        ({"d_model": 4096, "n_layers": 4096, "n_heads": 32},
                                         "the file holds 0 values")])
def test_a_small_checkpoint_cannot_ask_for_a_large_model(tmp_path, cfg, words):
    path = metadata_only_checkpoint(tmp_path / "m.safetensors", **cfg)
    assert path.stat().st_size < 400
    t = time.perf_counter()
    with pytest.raises(InputFileError, match=words) as e:
        load_model(path)
    assert str(path) in str(e.value) and time.perf_counter() - t < 5


def test_analyze_of_the_248_byte_file_ends_in_one_line_under_a_2_gib_cap(tmp_path):
    """The finding as it was met: ``qkvlab analyze FILE``, now in a process that may not grow
    2 GiB past its imports (it reached 15.5 GB and a 30-line allocator traceback)."""
    path = metadata_only_checkpoint(tmp_path / "huge.safetensors", d_vocab=10**9)
    code = ("import resource, sys, qkvlab.cli, qkvlab.analysis.run\n"
            "vm = int([l for l in open('/proc/self/status') if l.startswith('VmSize')][0].split()[1])\n"
            "resource.setrlimit(resource.RLIMIT_AS, (vm * 1024 + (2 << 30),) * 2)\n"
            "sys.exit(qkvlab.cli.main(sys.argv[1:]))")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS.parent / "src"),
                                                        os.environ.get("PYTHONPATH", "")])}
    p = subprocess.run([sys.executable, "-c", code, "analyze", str(path), "--quiet", "--no-cka",
                        "--out", str(tmp_path / "out")], capture_output=True, text=True,
                       timeout=120, env=env)
    assert p.returncode == 2, p.stderr[-2000:]
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("qkvlab analyze: error: ") and str(path) in lines[0]


def test_an_honest_model_above_the_memory_limit_is_refused_with_the_way_to_raise_it(
        tmp_path, monkeypatch):
    from qkvlab import ModelConfig, build_model, save_model

    path = save_model(build_model(ModelConfig(d_vocab=50, n_ctx=16)), tmp_path / "m.safetensors")
    monkeypatch.setenv("QKVLAB_MAX_MEMORY", "64K")
    with pytest.raises(InputFileError, match="above the memory limit of 64.0 KiB.*--max-memory"):
        load_model(path)
    monkeypatch.setenv("QKVLAB_MAX_MEMORY", "1G")
    assert load_model(path).cfg.d_vocab == 50


# ---- 2: tracebacks from header values --------------------------------------------------------------
def gguf(tmp_path: Path, name: str, **fields) -> Path:
    """The fuzz seed's tiny llama GGUF with metadata fields replaced (``head_count=0``)."""
    meta, tensors = fuzz_formats.gguf_seed()
    meta = [(k, kind, fields.get(k.split(".")[-1], v)) for k, kind, v in meta]
    path = tmp_path / f"{name}.gguf"
    path.write_bytes(fuzz_formats.gguf_bytes(meta, tensors))
    return path


@pytest.mark.parametrize("field, value, words", [
    ("head_count", 0, "head_count' = 0 must be an integer of at least 1"),
    ("head_count_kv", 0, "head_count_kv' = 0 must be an integer of at least 1"),
    ("embedding_length", 0, "embedding_length' = 0 must be an integer of at least 1"),
    ("block_count", 5, "block_count = 5, but the tensors hold blocks 0-1"),
    ("head_count", 9, "head_count_kv 2 does not divide head_count 9"),
    ("head_count", 8, "do not split into 8 and 2 heads"),
    ("embedding_length", 9, "token_embd.weight has dimensions \\[8, 12\\]")])
def test_gguf_header_values_are_one_clear_error(tmp_path, field, value, words):
    path = gguf(tmp_path, f"{field}{value}", **{field: value})
    with pytest.raises(InputFileError, match=words) as e:
        resolve(str(path))
    assert str(path) in str(e.value)


def test_damaged_gguf_files_say_what_is_wrong_in_words(tmp_path):
    raw = fuzz_formats.gguf_bytes(*fuzz_formats.gguf_seed())
    said = []
    for cut in (6, 20, 30, 200, 900, 1500, 1800, len(raw) - 8):
        path = tmp_path / f"cut{cut}.gguf"
        path.write_bytes(raw[:cut])
        with pytest.raises(InputFileError) as e:
            resolve(str(path))
        said.append(str(e.value))
        assert str(path) in said[-1]
    assert not any("out of bounds for axis" in s for s in said)
    assert all("truncated" in s or "needs" in s for s in said)


def bert_folder(tmp_path: Path, **cfg) -> Path:
    import fuzz_inputs

    seeds = fuzz_inputs.seeds(tmp_path / "seeds")
    folder = seeds["bert"][1]
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, **cfg}))
    return folder


@pytest.mark.parametrize("cfg, words", [
    ({"num_attention_heads": 0}, "num_attention_heads = 0 must be an integer of at least 1"),
    ({"hidden_size": 0}, "hidden_size = 0 must be an integer of at least 1"),
    ({"num_attention_heads": 3}, "hidden_size 8 is not divisible by num_attention_heads 3"),
    ({"num_hidden_layers": 7}, "num_hidden_layers = 7, but the weight files hold 2 layers")])
def test_bert_config_values_are_one_clear_error(tmp_path, cfg, words):
    folder = bert_folder(tmp_path, **cfg)
    with pytest.raises(InputFileError, match=words) as e:
        resolve(str(folder))
    assert str(folder) in str(e.value)


def test_a_config_that_is_a_list_is_named(tmp_path):
    folder = bert_folder(tmp_path)
    (folder / "config.json").write_text("[1, 2, 3]")
    with pytest.raises(InputFileError, match="config.json: a JSON list, where a JSON object"):
        resolve(str(folder))


def test_shape_errors_name_the_file(tmp_path):
    from safetensors.numpy import load_file, save_file

    folder = bert_folder(tmp_path)
    w = load_file(folder / "model.safetensors")
    w["encoder.layer.1.attention.self.key.weight"] = w["encoder.layer.1.attention.self.key.weight"][:6]
    save_file(w, str(folder / "model.safetensors"))
    with pytest.raises(InputFileError, match="model.safetensors: layer 1: b_K has 8 values for "
                                             "6 outputs") as e:
        resolve(str(folder))
    assert str(folder) in str(e.value)
    folder = tmp_path / "seeds" / "llama"  # GQA that does not divide: named with the file
    cfg = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**cfg, "num_attention_heads": 9,
                                                    "num_key_value_heads": 2}))
    with pytest.raises(InputFileError, match="num_key_value_heads 2 does not divide "
                                             "num_attention_heads 9") as e:
        resolve(str(folder))
    assert str(folder) in str(e.value)


# ---- 2 and 5: the command line ------------------------------------------------------------------------
def test_cli_prints_bad_input_as_one_line_exit_2(tmp_path, capsys):
    from qkvlab import cli

    path = gguf(tmp_path, "zero", head_count=0)
    assert cli.main(["analyze", str(path), "--no-cka", "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    line = [x for x in err.splitlines() if "error" in x]
    assert len(line) == 1 and line[0].startswith("qkvlab analyze: error: ") and "Traceback" not in err


def test_an_unexpected_failure_is_one_line_with_its_traceback_kept(tmp_path, capsys, monkeypatch):
    from qkvlab import cli

    def broken(args):
        raise RuntimeError("something qkvlab did not expect")

    monkeypatch.setattr(cli, "cmd_designs", broken)
    assert cli.main(["designs"]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    assert err.startswith("qkvlab designs: internal error: RuntimeError: something qkvlab")
    saved = Path(err.split("traceback in ")[1].split(" (--debug")[0])
    assert "in broken" in saved.read_text()
    saved.unlink()
    assert cli.main(["designs", "--debug"]) == 1
    assert "Traceback (most recent call last)" in capsys.readouterr().err


def test_analyze_error_starts_its_own_line_after_the_progress_bar(tmp_path, capsys):
    import argparse

    from qkvlab.analysis.cli import configure_analyze, run_analyze

    p = argparse.ArgumentParser()
    configure_analyze(p)
    path = gguf(tmp_path, "zero", head_count=0)
    assert run_analyze(p.parse_args([str(path), "--no-cka", "--out", str(tmp_path / "o")])) == 2
    err = capsys.readouterr().err
    assert "analyze" in err.split("qkvlab analyze: error")[0]  # the bar was drawn first
    assert "\nqkvlab analyze: error: " in err


# ---- 6: the formats the README lists, from a path -----------------------------------------------------
@pytest.mark.parametrize("name, data", [("vit.onnx", fuzz_formats.onnx_bytes),
                                        ("model.bin", lambda: fuzz_formats.marian_bytes(
                                            fuzz_formats.marian_items()))])
def test_analyze_reads_onnx_and_marian_files_by_path(tmp_path, name, data):
    path = tmp_path / "any-name"  # by content, not by name
    path.write_bytes(data())
    view = resolve(str(path))
    assert view.family == ("vit" if name.endswith("onnx") else "marian") and view.layers
    assert "ONNX" in SUPPORTED and "Marian" in SUPPORTED


@pytest.mark.parametrize("zoo_name", ["dinov2-s", "marian-enpt"])
def test_zoo_files_by_path_when_fetched(zoo_name):
    from qkvlab.analysis.sources import builtin_path
    from qkvlab.analysis.zoo import ZooError

    try:
        path = builtin_path(zoo_name)
    except ZooError:
        pytest.skip(f"{zoo_name} is not fetched (qkvlab zoo fetch {zoo_name})")
    by_path, by_name = resolve(str(path)), resolve(zoo_name)
    assert [lay.name for lay in by_path.layers] == [lay.name for lay in by_name.layers]


def test_memory_limit_parsing():
    from qkvlab.inputs import parse_bytes

    assert parse_bytes("16G") == 16 << 30 and parse_bytes("512M") == 512 << 20
    assert parse_bytes("2.5GiB") == int(2.5 * (1 << 30)) and parse_bytes("1000") == 1000
    for bad in ("", "x", "-1G", "0"):
        with pytest.raises(ValueError, match="max-memory"):
            parse_bytes(bad)


# ---- issue 41: no code runs from a model folder ---------------------------------------------------
def test_every_from_pretrained_in_src_passes_trust_remote_code_false():
    """transformers' default may change and a config may ask: every call says False itself,
    as a keyword or in the dict literal of its function that it spreads as ``**kw``."""
    import ast

    def says_false(key, value):
        return isinstance(key, ast.Constant) and key.value == "trust_remote_code" and \
            isinstance(value, ast.Constant) and value.value is False

    calls = []
    for path in sorted((TESTS.parent / "src" / "qkvlab").rglob("*.py")):
        for fn in ast.walk(ast.parse(path.read_text())):
            if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            in_dict = any(says_false(k, v) for d in ast.walk(fn) if isinstance(d, ast.Dict)
                          for k, v in zip(d.keys, d.values))
            for node in ast.walk(fn):
                if isinstance(node, ast.Call) and \
                        getattr(node.func, "attr", "") == "from_pretrained":
                    ok = any(says_false(ast.Constant(k.arg), k.value) for k in node.keywords) \
                        or (in_dict and any(k.arg is None for k in node.keywords))
                    calls.append((f"{path.name}:{node.lineno}", ok))
    assert len(calls) >= 8 and sorted({c for c, ok in calls if not ok}) == []


def remote_code_folder(tmp_path: Path, file: str, key: str) -> Path:
    """The fuzz seed's Llama folder whose ``file`` also carries ``key``."""
    import fuzz_inputs

    folder = fuzz_inputs.seeds(tmp_path / "seeds")["llama"][1]
    path = folder / file
    cfg = json.loads(path.read_text()) if path.is_file() else {}
    cfg[key] = {"AutoModelForCausalLM": "evil.Model"} if key == "auto_map" else True
    path.write_text(json.dumps(cfg))
    return folder


@pytest.mark.parametrize("file, key", [("config.json", "auto_map"),
                                       ("config.json", "trust_remote_code"),
                                       ("tokenizer_config.json", "auto_map"),
                                       ("tokenizer_config.json", "trust_remote_code")])
def test_a_folder_asking_for_its_own_code_is_refused_before_transformers_reads_it(
        tmp_path, monkeypatch, file, key):
    import transformers

    from qkvlab.hf.cost import load_lm

    folder = remote_code_folder(tmp_path, file, key)
    read = []
    for cls in ("AutoConfig", "AutoModel", "AutoModelForCausalLM", "AutoTokenizer"):
        monkeypatch.setattr(getattr(transformers, cls), "from_pretrained",
                            lambda *a, **k: read.append(a) or 1 / 0)
    said = (f"{folder / file}: carries {key!r}, which asks transformers to run the folder's own "
            "code; qkvlab runs no code from a model folder (refused)")
    for load in (load_lm, resolve):
        with pytest.raises(InputFileError) as e:
            load(str(folder))
        assert str(e.value) == said
    assert read == []


def test_gguf_tokenizer_metadata_that_builds_no_tokenizer_is_one_clear_error(tmp_path):
    """Merges naming a token the vocabulary lacks: the tokenizers library raises a bare
    Exception ('Error while initializing BPE'), which reached the user as a traceback."""
    pytest.importorskip("transformers")
    from qkvlab.analysis.load_llama import gguf_tokenizer
    from qkvlab.inputs import InputFileError

    class Field:
        def __init__(self, value):
            self.value = value

        def contents(self):
            return self.value

    class Reader:
        fields = {"general.architecture": Field("llama"), "tokenizer.ggml.model": Field("gpt2"),
                  "tokenizer.ggml.tokens": Field(["a", "c"]),
                  "tokenizer.ggml.token_type": Field([1, 1]),
                  "tokenizer.ggml.merges": Field(["a b"])}
    path = tmp_path / "m.gguf"
    with pytest.raises(InputFileError, match=r"m.gguf: its tokenizer metadata does not build a "
                                             r"tokenizer \(Error while initializing BPE"):
        gguf_tokenizer(Reader(), path)


def test_a_null_with_no_finite_sample_is_one_clear_error():
    """Degenerate weights (all zeros, NaN) leave no finite null sample: torch.quantile on the
    empty rest raised instead of saying so."""
    import torch

    from qkvlab.analysis.measures import summarize
    with pytest.raises(ValueError, match="every sample is NaN or infinite"):
        summarize(torch.tensor([float("nan"), float("inf")]))
    assert summarize(torch.tensor([1.0, float("nan"), 3.0]))["null_n"] == 2


def test_load_lm_refuses_tokenizer_metadata_that_builds_no_tokenizer(tmp_path, monkeypatch):
    """The tiecost/convert loader: the same bare Exception from AutoTokenizer is one line, and
    so is a KeyError, ValueError, TypeError or IndexError, what transformers' converters raise
    on metadata they do not expect (the fuzz corpus's flipped 'scores' key); any other error
    stays what it is."""
    pytest.importorskip("transformers")
    import transformers

    from qkvlab.hf.loading import load_tokenizer
    from qkvlab.inputs import InputFileError

    def broken(*a, **k):
        raise Exception("Error while initializing BPE: Token `b` out of vocabulary")
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", broken)
    with pytest.raises(InputFileError, match=r"m.gguf: its tokenizer metadata does not build"):
        load_tokenizer(tmp_path / "m.gguf", str(tmp_path))

    def renamed(*a, **k):
        raise KeyError("scores")
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", renamed)
    with pytest.raises(InputFileError, match=r"m.gguf: its tokenizer metadata does not build a "
                                             r"tokenizer \(KeyError: 'scores'\)"):
        load_tokenizer(tmp_path / "m.gguf", str(tmp_path))

    def bug(*a, **k):
        raise AttributeError("a bug of ours stays a bug")
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", bug)
    with pytest.raises(AttributeError):
        load_tokenizer(tmp_path / "m.gguf", str(tmp_path))


def test_tiecost_says_a_refused_model_as_its_own_one_line(tmp_path, capsys):
    """It said ``error: measure tie_fit failed: InputFileError: ...``: bad input passed through
    the store's measure as if the measure had failed."""
    from qkvlab.cli import main

    folder = remote_code_folder(tmp_path, "config.json", "auto_map")
    assert main(["tiecost", str(folder), "--db", str(tmp_path / "r.db")]) == 2
    assert capsys.readouterr().err == (
        f"qkvlab tiecost: error: {folder / 'config.json'}: carries 'auto_map', which asks "
        "transformers to run the folder's own code; qkvlab runs no code from a model folder "
        "(refused)\n")
