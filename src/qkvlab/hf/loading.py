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

import logging
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


def load_checked(cls, path: str | Path, folder: str, **kw):
    """``cls.from_pretrained(folder, **kw)``, refused unless the file fills the model exactly
    and every parameter and buffer is finite (see the module docstring); ``path`` is the file
    or folder the errors name."""
    from transformers import modeling_utils

    kw = {**kw, "trust_remote_code": False}  # whatever the caller passed: no folder's code
    hold = _NoLoadReport()
    modeling_utils.logger.addFilter(hold)
    try:
        model, info = cls.from_pretrained(folder, output_loading_info=True,
                                          ignore_mismatched_sizes=True, **kw)
    except RuntimeError as e:
        if not str(e).startswith(_RAISED):
            raise
        raise InputFileError(f"{path}: transformers could not load the weights: "
                             f"{' '.join(str(e).split())[:300]} (refused)", path=path) from None
    finally:
        modeling_utils.logger.removeFilter(hold)
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
    except Exception as e:  # noqa: BLE001 - only the library's bare Exception is re-worded
        if type(e) is not Exception:
            raise
        raise InputFileError(f"{path}: its tokenizer metadata does not build a tokenizer ({e})",
                             path=path) from None
