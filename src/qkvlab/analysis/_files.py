"""Safe reading of weight files: safetensors, GGUF, ``torch.load(weights_only=True)``; no pickle.

Every failure is a :class:`qkvlab.inputs.InputFileError`
(a ``ValueError``), naming the file and what is wrong. Nothing in a checkpoint is ever
executed: pickles are read only through PyTorch's ``weights_only`` unpickler, which refuses any
global that is not a tensor or plain container. Numbers in a header or config are checked
against :data:`qkvlab.inputs.BOUNDS` and against the tensors in the file before anything is
allocated from them (:func:`config_int`, :func:`check_layers`, :func:`take`).
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

from qkvlab.inputs import InputFileError, bounded_int, check_memory


# A checkpoint is missing, unreadable, corrupt, unsafe or of an unsupported kind: the one error
# type of every input file (the name predates it and stays for callers that catch it).


# File magic -> kind. CTranslate2 starts with a small uint32 version, then a "...Spec" name;
# Marian with the uint64 version 1, a uint64 item count and the first item's name length and
# type; ONNX (a protobuf ModelProto) with field 1, ir_version, then another ModelProto field.
MARIAN_TYPES = (0x0101, 0x0404, 0x4101)  # special (model.yml), float32, intgemm8
ONNX_FIELDS = (0x12, 0x1A, 0x22, 0x28, 0x32, 0x3A, 0x42, 0x72)  # tags of ModelProto fields 2-8, 14


def sniff(path: Path) -> str:
    """``safetensors`` | ``gguf`` | ``torch-zip`` | ``pickle`` | ``ctranslate2`` | ``marian``
    | ``onnx`` | ``unknown``, from the first bytes."""
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
        if 2 <= n < 100_000_000 and head[8:9] == b"{":  # at least "{}"
            return "safetensors"
        version, name_len = int.from_bytes(head[:4], "little"), int.from_bytes(head[4:6], "little")
        if 1 <= version <= 10 and 0 < name_len < 60 and head[6:6 + name_len - 1].endswith(b"Spec"):
            return "ctranslate2"
    if len(head) >= 32 and n == 1:
        items, name_len = (int.from_bytes(head[i:i + 8], "little") for i in (8, 16))
        if 0 < items < 100_000 and 0 < name_len < 4096 and \
                int.from_bytes(head[24:32], "little") in MARIAN_TYPES:
            return "marian"
    if len(head) >= 3 and head[0] == 0x08 and 1 <= head[1] <= 64 and head[2] in ONNX_FIELDS:
        return "onnx"
    return "unknown"


def require_file(path: str | os.PathLike) -> Path:
    path = Path(path)
    if not path.exists():
        raise InputFileError(f"{path}: no such file")
    if not path.is_file():
        raise InputFileError(f"{path}: not a file")
    if path.stat().st_size == 0:
        raise InputFileError(f"{path}: empty file")
    return path


def read_json(path: Path) -> dict:
    """A JSON object (a config) from ``path``; anything else is a InputFileError."""
    path = require_file(path)
    if path.stat().st_size > 64 << 20:  # configs and indexes are kilobytes
        raise InputFileError(f"{path}: {path.stat().st_size:,} bytes is too large for a JSON "
                              "config (at most 64 MiB)")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as e:
        raise InputFileError(f"{path}: not valid JSON ({e})") from None
    if not isinstance(data, dict):
        raise InputFileError(f"{path}: a JSON {type(data).__name__}, where a JSON object "
                              "(a config of named fields) is expected")
    return data


# Keys with which an HF folder asks transformers to import Python code of its own (auto_map
# names classes in the folder's .py files); qkvlab refuses such a folder before transformers
# reads a byte of it, whatever trust_remote_code would say.
REMOTE_CODE_KEYS = ("auto_map", "trust_remote_code")
HF_FOLDER_CONFIGS = ("config.json", "tokenizer_config.json")


def check_hf_folder(path: str | os.PathLike) -> Path:
    """The folder transformers will read for ``path`` (an HF folder, or the folder of a file
    in one, such as a ``.gguf``), once none of its configs asks for code of its own.

    Raises:
        InputFileError: ``config.json`` or ``tokenizer_config.json`` carries ``auto_map`` or
            ``trust_remote_code`` (named, with the file), or is not a JSON object.
    """
    path = Path(path)
    folder = path if path.is_dir() else path.parent
    for name in HF_FOLDER_CONFIGS:
        if (folder / name).exists():
            cfg = read_json(folder / name)
            found = [k for k in REMOTE_CODE_KEYS if k in cfg]
            if found:
                raise InputFileError(f"{folder / name}: carries {found[0]!r}, which asks "
                                     "transformers to run the folder's own code; qkvlab runs no "
                                     "code from a model folder (refused)", path=folder / name)
    return folder


def config_int(cfg: dict, key: str, where, *, bound: str | None = None, lo: int = 1,
               default=None) -> int:
    """``cfg[key]`` as a bounded int (:func:`qkvlab.inputs.bounded_int`); ``default`` when
    absent (or null) if given, else a InputFileError naming the missing field."""
    value = cfg.get(key)
    if value is None:
        if default is None:
            raise InputFileError(f"{where}: field {key!r} missing")
        return default
    return bounded_int(value, key, str(where), lo=lo, bound=bound)


def safetensors_files(folder: Path) -> list[Path]:
    """The weight files of an HF folder: one file, or the shards its index names (plain file
    names inside the folder: an index never sends the reader elsewhere)."""
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        weight_map = read_json(index).get("weight_map", {})
        if not isinstance(weight_map, dict) or not all(
                isinstance(s, str) for s in weight_map.values()):
            raise InputFileError(f"{index}: weight_map must map tensor names to file names")
        shards = sorted(set(weight_map.values()))
        bad = [s for s in shards if Path(s).name != s or s in ("", ".", "..")]
        if bad:
            raise InputFileError(f"{index}: shard {bad[0]!r} is not a file name inside "
                                  f"{folder}; refused")
        if not shards:
            raise InputFileError(f"{index}: weight_map names no weight file")
        return [require_file(folder / s) for s in shards]
    files = sorted(folder.glob("*.safetensors"))
    if files:
        return files
    if (folder / "pytorch_model.bin").is_file():
        return [folder / "pytorch_model.bin"]
    raise InputFileError(f"{folder}: no *.safetensors (or pytorch_model.bin) weight file")


def read_tensors(files: list[Path]) -> dict[str, Tensor]:
    """Every tensor of the given weight files (safetensors or weights-only torch), as stored.

    Raises:
        InputFileError: a file is unreadable, or reading them all would pass the memory limit.
    """
    check_memory(files[0].parent, sum(f.stat().st_size for f in files), "reading its weight files")
    out: dict[str, Tensor] = {}
    for f in files:
        out.update(read_safetensors(f) if f.suffix == ".safetensors" else torch_load_safe(f))
    return out


def read_safetensors(path: Path) -> dict[str, Tensor]:
    """All tensors of one safetensors file; a truncated or corrupt file raises InputFileError."""
    path = require_file(path)
    try:
        with safe_open(str(path), framework="pt") as f:
            return {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118 (safe_open is not a dict)
    except Exception as e:  # SafetensorsError, OSError: header or offsets do not fit the file
        raise InputFileError(f"{path}: corrupt or truncated safetensors file ({e})") from None


def torch_load_safe(path: Path) -> dict[str, Tensor]:
    """``torch.load(weights_only=True)``: a pickle that carries code is refused, not run.

    Raises:
        InputFileError: the file is missing, not a PyTorch checkpoint, corrupt, holds
            pickled objects other than tensors, or is not a dict of tensors.
    """
    path = require_file(path)
    kind = sniff(path)
    if kind not in ("torch-zip", "pickle"):
        raise InputFileError(f"{path}: not a PyTorch checkpoint (looks like {kind})")
    try:
        obj = torch.load(path, map_location="cpu", weights_only=True, mmap=kind == "torch-zip")
    except pickle.UnpicklingError as e:  # a global that is not a tensor or plain container
        raise InputFileError(_pickled_objects(path, str(e))) from None
    except Exception as e:  # RuntimeError for bad zips, IndexError/EOFError for cut pickles
        first = str(e).split(". ")[0].strip()[:200]
        raise InputFileError(f"{path}: corrupt or truncated PyTorch checkpoint "
                              f"({type(e).__name__}: {first})") from None
    if isinstance(obj, dict) and "state_dict" in obj and isinstance(obj["state_dict"], dict):
        obj = obj["state_dict"]
    if not isinstance(obj, dict) or not all(isinstance(v, Tensor) for v in obj.values()):
        raise InputFileError(f"{path}: expected a dict of tensors (a state_dict)")
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


def take(tensors: dict[str, Tensor], name: str, where: Path | str, ndim: int | None = None
         ) -> Tensor:
    """``tensors[name]`` as float64, or a InputFileError naming the missing tensor (or one
    that is not ``ndim``-dimensional, or not floating point)."""
    if name not in tensors:
        near = [k for k in tensors if k.split(".")[-1] == name.split(".")[-1]][:3]
        raise InputFileError(f"{where}: tensor {name!r} not found (similar: {near})")
    t = tensors[name]
    if not t.is_floating_point():
        raise InputFileError(f"{where}: tensor {name!r} holds {t.dtype}, not floating point")
    if ndim is not None and t.dim() != ndim:
        raise InputFileError(f"{where}: tensor {name!r} has shape {tuple(t.shape)}; "
                              f"{ndim} dimensions expected")
    return t.to(torch.float64)


def count_layers(tensors, name) -> int:
    """How many consecutive layers 0, 1, ... have a tensor named ``name(i)``."""
    n = 0
    while name(n) in tensors:
        n += 1
    return n


def check_layers(where, stated: int, found: int, key: str) -> None:
    """A config's layer count must be the number of layers its weight files hold."""
    if stated != found:
        raise InputFileError(f"{where}: {key} = {stated}, but the weight files hold "
                              f"{found} layer{'s' if found != 1 else ''}")


def as_input_error(where, what: str, e: Exception) -> InputFileError:
    """A InputFileError for a shape or value problem ``e`` found while building ``what``."""
    if isinstance(e, InputFileError):
        return e
    return InputFileError(f"{where}: {what}: {e}")
