"""A pretrained HF decoder loaded only when its file fills the model its config describes.

``from_pretrained`` fills whatever the weights lack with freshly initialized values and carries
on: a config claiming more layers than the file holds, a GGUF ``block_count`` one too high, a
missing ``attn_v`` tensor, a relabelled architecture (Llama weights read as Qwen2, whose q/k/v
biases then come from the initializer) all load and get a perplexity. ``load_checked`` asks for
the loading report (``output_loading_info=True``) and refuses any key missing from the file,
left over in it, or of the wrong shape, and any error transformers reports, naming the first few
tensors; then it refuses a model with a NaN or an infinity in any parameter or buffer, naming
the first. Keys transformers ties (``lm_head.weight`` with ``tie_word_embeddings``) or is told
to ignore are not in its report, so an honest model passes untouched.

The loading report transformers logs as a warning (a table of the same keys) is held back while
the load runs: the refusal says it in one line.
"""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path

from qkvlab.inputs import InputFileError, check_finite

SHOWN = 3  # tensor names given per kind of problem
_RAISED = ("Error(s) in loading state_dict", "We encountered some issues during automatic "
           "conversion")  # the RuntimeErrors transformers raises for a file that does not fit


class _NoLoadReport(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return "LOAD REPORT" not in str(record.msg)


def _names(keys) -> list[str]:
    """Sorted key names; a mismatched key comes as (name, shape in file, shape in model)."""
    return sorted(k if isinstance(k, str) else
                  f"{k[0]} (shape {tuple(k[1])} in the file, {tuple(k[2])} in the model)"
                  for k in keys)


def check_loading_info(path: str | Path, info: dict, model_name: str) -> None:
    """Refuse ``path`` when transformers' loading ``info`` reports anything.

    Raises:
        InputFileError: the count and first ``SHOWN`` names of each kind of problem.
    """
    said = []
    for key, words in (("missing_keys", "missing from the file (transformers would initialize "
                                        "them at random)"),
                       ("unexpected_keys", "in the file but not in the model"),
                       ("mismatched_keys", "of the wrong shape"),
                       ("error_msgs", None)):
        if key == "error_msgs":
            names = [" ".join(str(m).split())[:200] for m in info.get(key) or ()]
            head = f"transformers reported {len(names)} error{'s' * (len(names) != 1)}"
        else:
            names = _names(info.get(key) or ())
            head = f"{len(names)} tensor{'s' * (len(names) != 1)} {words}"
        if names:
            more = f", and {len(names) - SHOWN} more" if len(names) > SHOWN else ""
            said.append(f"{head}: {', '.join(names[:SHOWN])}{more}")
    if said:
        raise InputFileError(f"{path}: the weights do not fill the {model_name} its config "
                             f"describes; {'; '.join(said)} (refused)", path=path)


def check_before_load(path: str | Path) -> None:
    """The checks that need no model, before transformers builds one: a GGUF file read as
    ``analyze`` reads it (``analysis.load_llama.open_gguf``: the header walked against the file,
    overlapping tensor data, special token ids inside the vocabulary, then every size its
    metadata states bounded and matched to the tensors' shapes: transformers would build a
    block_count of 2^31 layers, or fail on a size of "x" with a traceback), and an HF
    folder's stated layer count against the layers its safetensors hold (a config claiming
    4,000 layers was built in full, 16 s for a 16-wide model, before the load report refused
    it).

    Raises:
        InputFileError: naming the file and the first problem.
    """
    path = Path(path)
    if path.is_file():  # the header walk, then every size the metadata states, bounded and
        from qkvlab.analysis.load_llama import open_gguf  # checked against the tensors' shapes
        open_gguf(path)
        return
    try:
        cfg = json.loads((path / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return  # transformers says what is wrong with it
    stated = cfg.get("num_hidden_layers") if isinstance(cfg, dict) else None
    files = sorted(path.glob("*.safetensors"))
    if not isinstance(stated, int) or isinstance(stated, bool) or not files:
        return
    from safetensors import safe_open

    found: set[int] = set()
    for f in files:
        try:
            with safe_open(str(f), "pt") as st:
                found |= {int(m.group(1)) for k in st.keys()
                          if (m := re.search(r"(?:^|\.)layers\.(\d+)\.", k))}
        except Exception:  # noqa: BLE001 - a damaged file: the load that follows names it
            return
    if found and stated != len(found):
        raise InputFileError(f"{path}: config.json says num_hidden_layers = {stated:,}, but "
                             f"the weight files hold {len(found)} layers (refused)", path=path)


def _config_errors() -> tuple[type[Exception], ...]:
    """What transformers' strict configs raise on a value of the wrong type or range (not a
    ValueError: huggingface_hub's StrictDataclassError), where that library has it."""
    try:
        from huggingface_hub.errors import StrictDataclassError
    except ImportError:
        return ()
    return (StrictDataclassError,)


def _quiet_gguf_bar():
    """Silence the GGUF reader's own bar (a plain ``tqdm``, deaf to transformers' switch) while
    a load runs; returns the undo. Where transformers has moved it, nothing is changed."""
    try:
        from transformers import modeling_gguf_pytorch_utils as gguf_utils
    except ImportError:
        return lambda: None
    bar = getattr(gguf_utils, "tqdm", None)
    if bar is None:
        return lambda: None
    gguf_utils.tqdm = lambda *a, **k: bar(*a, **{**k, "disable": True})

    def undo() -> None:
        gguf_utils.tqdm = bar
    return undo


def load_checked(cls, path: str | Path, folder: str, **kw):
    """``cls.from_pretrained(folder, **kw)``, refused unless the file fills the model exactly
    and every parameter and buffer is finite (see the module docstring); ``path`` is the file
    or folder the errors name. :func:`check_before_load` runs first; transformers' progress
    bars stay off while it loads (a refusal is then the command's one line)."""
    from transformers import modeling_utils
    from transformers.utils import logging as hf_logging

    check_before_load(path)
    kw = {**kw, "trust_remote_code": False}  # whatever the caller passed: no folder's code
    hold = _NoLoadReport()
    modeling_utils.logger.addFilter(hold)
    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    quiet = _quiet_gguf_bar()
    try:
        model, info = cls.from_pretrained(folder, output_loading_info=True,
                                          ignore_mismatched_sizes=True, **kw)
    except RuntimeError as e:
        if not str(e).startswith(_RAISED):
            raise
        raise InputFileError(f"{path}: transformers could not load the weights: "
                             f"{' '.join(str(e).split())[:300]} (refused)", path=path) from None
    except (ValueError, TypeError, KeyError, IndexError, AttributeError, OverflowError,
            *_config_errors()) as e:  # a config value transformers' own checks refuse
        if isinstance(e, InputFileError):
            raise
        raise InputFileError(f"{path}: transformers cannot build a model from it "
                             f"({type(e).__name__}: {' '.join(str(e).split())[:200]})",
                             path=path) from None
    finally:
        modeling_utils.logger.removeFilter(hold)
        if bars:
            hf_logging.enable_progress_bar()
        quiet()
    check_loading_info(path, info, type(model).__name__)
    check_finite(path, [*model.named_parameters(), *model.named_buffers()])
    return model


def load_tokenizer(path: str | Path, folder: str, **kw):
    """``AutoTokenizer.from_pretrained(folder, **kw)``, a file whose tokenizer metadata builds
    no tokenizer (merges naming tokens the vocabulary lacks, say: the tokenizers library raises
    a bare ``Exception``) refused as one :class:`InputFileError` naming ``path``."""
    from transformers import AutoTokenizer
    try:
        kw.pop("trust_remote_code", None)
        return AutoTokenizer.from_pretrained(folder, trust_remote_code=False, **kw)
    except Exception as e:  # noqa: BLE001 - the library's bare Exception, and what its
        # converters raise on metadata they do not expect (a GGUF's renamed 'scores' key)
        if type(e) not in (Exception, KeyError, ValueError, TypeError, IndexError):
            raise
        raise InputFileError(f"{path}: its tokenizer metadata does not build a tokenizer "
                             f"({type(e).__name__}: {e})", path=path) from None
