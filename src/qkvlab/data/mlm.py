"""``mlm``: masked-language modelling on real text (an Encoder); masked-token val loss.

The same corpora and tokenizers as ``lm`` (the prepared cache is shared). BERT's corruption
(Devlin et al. 2019): each position is chosen with probability ``mask_prob`` (at least one per
row, so a batch always has a loss); a chosen token becomes ``<mask>`` 80% of the time, a random
non-special token 10%, and stays itself 10%. The loss is taken on chosen positions only.

Batch: ``idx`` (B, T) corrupted tokens, ``targets`` (B, T) original ids at chosen positions,
``IGNORE`` elsewhere. No padding: windows are full length.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from qkvlab.data.base import IGNORE, register
from qkvlab.data.lm import TextTask
from qkvlab.data.tokenizers import MASK, SPECIALS


@register
@dataclass(frozen=True)
class MLM(TextTask):
    """Masked LM; metrics ``val_loss`` (nats per masked token) and ``accuracy`` (argmax on them)."""

    name = "mlm"
    version = 1
    model_kind = "encoder"

    seq_len: int = 128
    mask_prob: float = 0.15

    def __post_init__(self) -> None:
        super().__post_init__()
        if not isinstance(self.mask_prob, (int, float)) or not 0.0 < self.mask_prob < 1.0:
            raise ValueError(f"mlm.mask_prob: {self.mask_prob!r} must be in (0, 1)")

    def batch(self, split: str, batch_size: int, generator: torch.Generator) -> dict[str, Tensor]:
        x = self.windows(split, batch_size, self.seq_len, generator)  # (B, T)
        B, T = x.shape
        chosen = torch.rand(B, T, generator=generator) < self.mask_prob
        # One forced position per row: a row with no target would give a NaN mean loss.
        chosen[torch.arange(B), torch.randint(0, T, (B,), generator=generator)] = True
        action = torch.rand(B, T, generator=generator)  # < .8 mask, < .9 random, else keep
        random_tok = torch.randint(len(SPECIALS), self.d_vocab, (B, T), generator=generator)
        idx = torch.where(chosen & (action < 0.8), torch.full_like(x, MASK), x)
        idx = torch.where(chosen & (action >= 0.8) & (action < 0.9), random_tok, idx)
        targets = torch.where(chosen, x, torch.full_like(x, IGNORE))
        return {"idx": idx, "targets": targets}
