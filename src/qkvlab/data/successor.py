"""``successor``: a directed relation defined by content, for an Encoder and (``successor_causal``)
for a DecoderLM.

Rule: a sequence holds ``n_items`` distinct tokens in random order; at each position, output the
token of the sequence that comes next after this one in the (hidden) cyclic order of token ids
(the smallest larger id present, else the smallest id present). The encoder sees the whole
sequence; the causal version answers among the tokens before it (from the third position on, so
that there are at least two candidates).

Why: thread 003 asks why not one matrix W = W_Q = W_K, since "one attention head is responsible
for one syntactic or semantic relation between any two words". ``relation`` (induction) showed
that under a causal mask a symmetric score s(x, y) = s(y, x) costs nothing but the diagonal:
that relation is between *positions*. Here it is between *contents*, so a head that answers by
its attention alone needs the direction in its score. In the encoder a symmetric score cannot
rank every token's successor above its predecessor: for the tokens of one sequence, a0 → a1 →
... → a0 in the cycle, that would need s(a0, a1) > s(a0, a_{k-1}) = s(a_{k-1}, a0) >
s(a_{k-1}, a_{k-2}) > ... > s(a1, a0) = s(a0, a1), whatever the layer (the vectors compared may
carry context; the score of a pair is still the same both ways). The self-mask removes only
the diagonal. In the decoder each token chooses among the tokens before it, so no such cycle
arises within a sequence: the two versions tell whether the causal mask spares the tie here
too. A model can also route around its heads: attend to both neighbours and let the readout,
which knows the query token and has its own asymmetric weights, pick the next one. The study
measures which happens.

Batch: ``idx`` (B, T) with T = ``n_items`` (``seq_len`` is derived), ``targets`` (B, T) the
successor's id (``IGNORE`` where no answer is asked). ``chance``: the mean over answered
positions of 1 / (number of candidates), a uniform pick among the other tokens it may see.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from qkvlab.data.base import IGNORE, Task, check_int, check_split, register


def successors(idx: Tensor, causal: bool) -> Tensor:
    """The cyclic successor (by id) of each token among the row's tokens (``causal``: among the
    tokens before it; ``IGNORE`` at the first two positions). ``idx`` (B, T) distinct per row."""
    T = idx.shape[1]
    a, b = idx[:, :, None], idx[:, None, :]  # query a at i, candidate b at j
    ok = b != a
    if causal:
        ok = ok & torch.ones(T, T, dtype=torch.bool).tril(-1)
    # rank of b after a in the cycle: (b - a) mod V is smallest for the successor; any modulus
    # above the largest id gives the same order
    gap = (b - a) % (int(idx.max()) + 1)
    gap = gap.masked_fill(~ok, torch.iinfo(gap.dtype).max)
    out = idx.gather(1, gap.argmin(-1))
    if causal:
        out[:, :2] = IGNORE
    return out


@dataclass(frozen=True)
class _Successor(Task):
    """Metrics: ``val_loss`` and ``accuracy`` at the answered positions."""

    version = 1
    causal = False

    seq_len: int | None = None  # derived: n_items
    vocab: int = 32
    n_items: int = 8

    def __post_init__(self) -> None:
        check_int(self, "vocab", 3)
        check_int(self, "n_items", 3, self.vocab)
        if self.seq_len is None:
            object.__setattr__(self, "seq_len", self.n_items)
        super().__post_init__()
        if self.seq_len != self.n_items:
            raise ValueError(f"{self.name}.seq_len: {self.seq_len} must equal n_items = "
                             f"{self.n_items} (or be left out)")

    @property
    def chance(self) -> float:
        """Accuracy of a uniform pick among the candidates, averaged over answered positions."""
        n = self.n_items
        if not self.causal:
            return 1.0 / (n - 1)
        return sum(1.0 / i for i in range(2, n)) / (n - 2)

    @property
    def d_vocab(self) -> int:
        return self.vocab

    def batch(self, split: str, batch_size: int, generator: torch.Generator) -> dict[str, Tensor]:
        check_split(self, split)  # every batch is fresh; the split only names the stream
        idx = torch.rand(batch_size, self.vocab, generator=generator,
                         dtype=torch.float64).argsort(1)[:, :self.n_items]
        return {"idx": idx, "targets": successors(idx, self.causal)}


@register
@dataclass(frozen=True)
class Successor(_Successor):
    name = "successor"
    model_kind = "encoder"


@register
@dataclass(frozen=True)
class SuccessorCausal(_Successor):
    name = "successor_causal"
    model_kind = "decoder"
    causal = True
