"""``mqar``: multi-query associative recall (Arora et al., "Zoology", ICLR 2024), for a DecoderLM.

Follows Zoology's ``multiquery_ar`` generator: ``n_pairs`` key-value pairs ``k1 v1 k2 v2 ...``
(distinct keys from ``1 .. vocab//2 - 1``, distinct values from ``vocab//2 .. vocab - 1``), then
a query region where each key reappears once, at even offsets drawn from a power law
(``power_a``: small gaps are likely, so most queries come soon after the context). Every other
query-region token is random noise from the whole vocabulary except the sequence's keys
(``random_non_queries``; 0 when off). The target at a query key's position is its value; every
other position is ``IGNORE``.

Key and value are adjacent tokens, so a head can read the value from the position after the
matched key: MQAR does not isolate K = V tying (``bind`` does).

Batch: ``idx`` (B, T), ``targets`` (B, T). Chance accuracy = 1 / n_pairs: a model that has
only learnt "the answer is one of this sequence's values" (no recall) guesses among the
``n_pairs`` values in its context. (It was ≈ 2 / vocab, the floor of a guesser that does not
even read the context; every design at quick sat at 26% with n_pairs 4, which that floor of
3% called "learned".)
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from qkvlab.data.base import IGNORE, Task, check_int, check_split, register


@register
@dataclass(frozen=True)
class MQAR(Task):
    """Metrics: ``val_loss`` and ``accuracy`` at the query positions."""

    name = "mqar"
    version = 1
    model_kind = "decoder"

    seq_len: int = 64
    vocab: int = 256
    n_pairs: int = 8
    power_a: float = 0.01
    random_non_queries: bool = True

    @property
    def chance(self) -> float:
        """Accuracy without recall: 1 / n_pairs, a uniform pick among the context's values.

        This is the plateau a model reaches before recall appears (loss ln n_pairs), so it,
        not 2 / vocab, is the floor against which "learned" is judged."""
        return 1.0 / self.n_pairs

    def __post_init__(self) -> None:
        super().__post_init__()
        check_int(self, "vocab", 8)
        check_int(self, "n_pairs", 1)
        half = self.vocab // 2
        if self.n_pairs > half - 1:
            raise ValueError(f"mqar.n_pairs: {self.n_pairs} exceeds the {half - 1} keys of "
                             f"vocab {self.vocab}")
        if (self.seq_len - 2 * self.n_pairs) // 2 < self.n_pairs:
            raise ValueError(f"mqar.seq_len: {self.seq_len} leaves too few query slots for "
                             f"{self.n_pairs} pairs (need seq_len >= {4 * self.n_pairs})")
        if not isinstance(self.power_a, (int, float)) or not 0 < self.power_a <= 1:
            raise ValueError(f"mqar.power_a: {self.power_a!r} must be in (0, 1]")
        if not isinstance(self.random_non_queries, bool):  # config errors are all ValueError
            raise ValueError(  # noqa: TRY004
                f"mqar.random_non_queries: {self.random_non_queries!r} must be a bool")

    @property
    def d_vocab(self) -> int:
        return self.vocab

    def batch(self, split: str, batch_size: int, generator: torch.Generator) -> dict[str, Tensor]:
        # split only names the stream: every batch is fresh, so train and val never repeat
        # an example except by chance (of order (vocab/2)^-n_pairs).
        check_split(self, split)
        B, D, T, V, g = batch_size, self.n_pairs, self.seq_len, self.vocab, generator
        half, ctx = V // 2, 2 * self.n_pairs
        # argsort of uniform noise = a random permutation per row; its first D are distinct.
        keys = torch.rand(B, half - 1, generator=g, dtype=torch.float64).argsort(1)[:, :D] + 1
        vals = torch.rand(B, V - half, generator=g, dtype=torch.float64).argsort(1)[:, :D] + half
        context = torch.stack([keys, vals], dim=2).reshape(B, ctx)  # (B, 2D): k1 v1 k2 v2 ...

        space = (T - ctx) // 2
        a = self.power_a
        p = a * torch.arange(1, space + 1, dtype=torch.float64) ** (a - 1)
        gaps = torch.multinomial((p / p.sum()).expand(B, space), D, replacement=False, generator=g)
        queries = torch.zeros(B, T - ctx + 1, dtype=torch.long)
        queries.scatter_(1, 2 * gaps, keys)  # key i sits at query offset 2 * gap_i
        seq = torch.cat([context, queries], dim=1)  # (B, T + 1)
        labels = torch.full((B, T + 1), IGNORE, dtype=torch.long)
        labels.scatter_(1, ctx + 2 * gaps + 1, vals)  # the value is the token after the query key

        idx, targets = seq[:, :-1], labels[:, 1:].contiguous()  # target at t = label of t + 1
        noise = torch.randint(0, V, (B, T), generator=g)
        # Noise that would repeat a context key is redrawn from the value range, so that every
        # reappearance of a key is a query (Zoology leaves such collisions in, unlabelled).
        hit = (noise[:, :, None] == keys[:, None, :]).any(-1)
        noise = torch.where(hit, torch.randint(half, V, (B, T), generator=g), noise)
        if self.random_non_queries:
            idx = torch.where(idx == 0, noise, idx)
        return {"idx": idx.contiguous(), "targets": targets}
