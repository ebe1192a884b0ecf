"""Safe reading of weight files: safetensors, GGUF, ``torch.load(weights_only=True)``; no pickle.

Every failure is a :class:`CheckpointError` (a ``ValueError``) naming the file and what is wrong.
Nothing in a checkpoint is ever executed: pickles are read only through PyTorch's
``weights_only`` unpickler, which refuses any global that is not a tensor or plain container.
"""

from __future__ import annotations

import json
import os
import pickle
import re
from pathlib import Path

import torch
from safetensors import safe_open
from torch import Tensor


class CheckpointError(ValueError):
    """A checkpoint is missing, unreadable, corrupt, unsafe or of an unsupported kind."""


# File magic -> kind. CTranslate2 starts with a small uint32 version, then a "...Spec" name.
def sniff(path: Path) -> str:
    """``safetensors`` | ``gguf`` | ``torch-zip`` | ``pickle`` | ``ctranslate2`` | ``unknown``."""
    path = require_file(path)
    with open(path, "rb") as f:
        head = f.read(64)
    if head[:4] == b"GGUF":
        return "gguf"
    if head[:2] == b"PK":
        return "torch-zip"
    if head[:1] == b"\x80":  # pickle protocol 2+ (legacy torch.save)
        return "pickle"
    if len(head) >= 8:
        n = int.from_bytes(head[:8], "little")
        if 0 < n < 100_000_000 and head[8:9] == b"{":
            return "safetensors"
        version, name_len = int.from_bytes(head[:4], "little"), int.from_bytes(head[4:6], "little")
        if 1 <= version <= 10 and 0 < name_len < 60 and head[6:6 + name_len - 1].endswith(b"Spec"):
            return "ctranslate2"
    return "unknown"


def require_file(path: str | os.PathLike) -> Path:
    path = Path(path)
    if not path.exists():
        raise CheckpointError(f"{path}: no such file")
    if not path.is_file():
        raise CheckpointError(f"{path}: not a file")
    if path.stat().st_size == 0:
        raise CheckpointError(f"{path}: empty file")
    return path


def read_json(path: Path) -> dict:
    path = require_file(path)
    try:
        return json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{path}: not valid JSON ({e})") from None


def safetensors_files(folder: Path) -> list[Path]:
    """The weight files of an HF folder: one file, or the shards its index names."""
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        shards = sorted(set(read_json(index).get("weight_map", {}).values()))
        return [require_file(folder / s) for s in shards]
    files = sorted(folder.glob("*.safetensors"))
    if files:
        return files
    if (folder / "pytorch_model.bin").is_file():
        return [folder / "pytorch_model.bin"]
    raise CheckpointError(f"{folder}: no *.safetensors (or pytorch_model.bin) weight file")


def read_tensors(files: list[Path]) -> dict[str, Tensor]:
    """Every tensor of the given weight files (safetensors or weights-only torch), as stored."""
    out: dict[str, Tensor] = {}
    for f in files:
        out.update(read_safetensors(f) if f.suffix == ".safetensors" else torch_load_safe(f))
    return out


def read_safetensors(path: Path) -> dict[str, Tensor]:
    """All tensors of one safetensors file; a truncated or corrupt file raises CheckpointError."""
    path = require_file(path)
    try:
        with safe_open(str(path), framework="pt") as f:
            return {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118 (safe_open is not a dict)
    except Exception as e:  # SafetensorsError, OSError: header or offsets do not fit the file
        raise CheckpointError(f"{path}: corrupt or truncated safetensors file ({e})") from None


def torch_load_safe(path: Path) -> dict[str, Tensor]:
    """``torch.load(weights_only=True)``: a pickle that carries code is refused, not run.

    Raises:
        CheckpointError: the file is missing, not a PyTorch checkpoint, corrupt, holds
            pickled objects other than tensors, or is not a dict of tensors.
    """
    path = require_file(path)
    kind = sniff(path)
    if kind not in ("torch-zip", "pickle"):
        raise CheckpointError(f"{path}: not a PyTorch checkpoint (looks like {kind})")
    try:
        obj = torch.load(path, map_location="cpu", weights_only=True, mmap=kind == "torch-zip")
    except pickle.UnpicklingError as e:  # a global that is not a tensor or plain container
        raise CheckpointError(_pickled_objects(path, str(e))) from None
    except Exception as e:  # RuntimeError for bad zips, IndexError/EOFError for cut pickles
        first = str(e).split(". ")[0].strip()[:200]
        raise CheckpointError(f"{path}: corrupt or truncated PyTorch checkpoint "
                              f"({type(e).__name__}: {first})") from None
    if isinstance(obj, dict) and "state_dict" in obj and isinstance(obj["state_dict"], dict):
        obj = obj["state_dict"]
    if not isinstance(obj, dict) or not all(isinstance(v, Tensor) for v in obj.values()):
        raise CheckpointError(f"{path}: expected a dict of tensors (a state_dict)")
    return obj


def _pickled_objects(path: Path, torch_message: str) -> str:
    """Our own refusal: torch's message advises loading with ``weights_only=False``."""
    found = re.search(r"GLOBAL ([\w.]+)", torch_message)
    what = f" (such as {found.group(1)})" if found else ""
    return (f"{path}: holds pickled Python objects other than tensors{what}; qkvlab refused to "
            "load it, because unpickling such a file can run arbitrary code. Convert it to "
            "safetensors with a trusted tool, on a machine where running the file's code is "
            "acceptable (e.g. load it with the code that wrote it and save the state_dict "
            "with safetensors.torch.save_file), then give qkvlab the .safetensors file")


def take(tensors: dict[str, Tensor], name: str, where: Path | str) -> Tensor:
    """``tensors[name]`` as float64, or a CheckpointError naming the missing tensor."""
    if name not in tensors:
        near = [k for k in tensors if k.split(".")[-1] == name.split(".")[-1]][:3]
        raise CheckpointError(f"{where}: tensor {name!r} not found (similar: {near})")
    return tensors[name].to(torch.float64)
