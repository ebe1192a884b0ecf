"""``relation``: a directed relation between tokens — induction — for a DecoderLM.

Rule (Olsson et al. 2022, "In-context Learning and Induction Heads"): at a token that occurred
before, output the token that followed (``direction="next"``) or preceded (``"previous"``) its
most recent previous occurrence. The score a head needs is asymmetric: the query "I am A" must
match the key "my predecessor was A", not "I am A". A tied W_Q = W_K gives the symmetric,
positive semi-definite score x·W·Wᵀ·y, which favours matching a token with itself (the
Reformer's problem), so the task measures what tying Q = K costs.

Layout: ``n_context`` distinct random tokens, then ``n_queries`` distinct query tokens drawn from
the context (never its last token for ``next``, never its first for ``previous``), so each query
has exactly one earlier occurrence and no query section token repeats. The queries are in random
order, so their answers cannot be read off a fixed offset.

Batch: ``idx`` (B, T), ``targets`` (B, T) = the answer at each query position, ``IGNORE``
elsewhere (those are exactly the positions where the rule applies). T = n_context + n_queries
(``seq_len`` is derived). Chance accuracy ≈ 1 / n_context.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from qkvlab.data.base import IGNORE, Task, check_choice, check_int, check_split, register

DIRECTIONS = ("next", "previous")


@register
@dataclass(frozen=True)
class Relation(Task):
    """Metrics: ``val_loss`` and ``accuracy`` at the query positions."""

    name = "relation"
    version = 1
    model_kind = "decoder"

    seq_len: int | None = None  # derived: n_context + n_queries
    vocab: int = 64
    n_context: int = 32
    n_queries: int = 16
    direction: str = "next"

    @property
    def chance(self) -> float:
        """Accuracy of guessing: 1 / n_context: one of the context tokens."""
        return 1.0 / self.n_context

    def __post_init__(self) -> None:
        check_int(self, "vocab", 2)
        check_int(self, "n_context", 2, self.vocab)
        check_int(self, "n_queries", 1, self.n_context - 1)
        check_choice(self, "direction", DIRECTIONS)
        need = self.n_context + self.n_queries
        if self.seq_len is None:
            object.__setattr__(self, "seq_len", need)
        super().__post_init__()
        if self.seq_len != need:
            raise ValueError(f"relation.seq_len: {self.seq_len} must equal n_context + n_queries "
                             f"= {need} (or be left out)")

    @property
    def d_vocab(self) -> int:
        return self.vocab

    def batch(self, split: str, batch_size: int, generator: torch.Generator) -> dict[str, Tensor]:
        check_split(self, split)  # every batch is fresh; the split only names the stream
        B, C, Q, g = batch_size, self.n_context, self.n_queries, generator
        ctx = torch.rand(B, self.vocab, generator=g, dtype=torch.float64).argsort(1)[:, :C]
        step = 1 if self.direction == "next" else -1
        # Query positions p in [0, C-2] (next) or [1, C-1] (previous): distinct, random order.
        pos = torch.rand(B, C - 1, generator=g, dtype=torch.float64).argsort(1)[:, :Q]
        pos = pos + (step < 0)
        queries, answers = ctx.gather(1, pos), ctx.gather(1, pos + step)
        idx = torch.cat([ctx, queries], dim=1)  # (B, C + Q)
        targets = torch.cat([torch.full((B, C), IGNORE, dtype=torch.long), answers], dim=1)
        return {"idx": idx, "targets": targets}
