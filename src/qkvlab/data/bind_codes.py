"""``bind_codes``: bind with key and value information of a set dimension ``m`` each.

Seed 004's claim is that K = V "loses a lot of expressiveness and might need much more
parameters". Its precise form: with K = V one d_head-wide vector per token carries both what is
matched and what is returned, so when a token's key and value information are independent and
each needs m dimensions, standard attention needs d_head ≈ m and tied K=V ≈ 2m. ``bind`` cannot
test that: its tokens have learned embeddings, and a learned embedding can pack any number of
keys on a circle (every point of a circle is the unique maximum of some dot product), so two
dimensions suffice for any key set and the width a design needs is not set by the task.

Here the key and the value of an item are m-bit codes, k, v ∈ {−1, +1}^m, and a token's input is
fixed to them (``input_codes``; the model's token embedding is frozen to this table, untied from
its readout): item (k, v) → [k, v], query for key k → [k, 0]. A one-layer model's attention then
sees each item through a linear map of [k, v] (after a LayerNorm, a common scale here: every item
code has the same norm). A linear score picks item j only if its key is a vertex of the hull of
the keys' images, and the image of the m-cube in fewer than m dimensions leaves vertices inside
that hull: matching needs rank m. With K = V the same map must also return v. In 2m dimensions
key and value get their own subspaces. In fewer, they share: in exact arithmetic even m
dimensions do (map [k, v] to A·k + ε·B·v with A and B of rank m: the small value part barely
moves the score, and the readout, which knows the queried key, reads v from the remainder), but
the value part then eats into the matching margin and the returned signal is small, so what K = V
costs below 2m is margin and learnability, not rank. The experiment measures the d_head each
design needs within a training budget.

All 2^m keys (and values) exist; a sequence holds ``n_items`` items with distinct keys (default:
all 2^m, at most 8) and random values, then ``n_queries`` queries of distinct keys among them.
Vocabulary and layout as ``bind``'s (n_keys = n_values = 2^m, no key groups); chance 1 / 2^m.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from qkvlab.data.base import IGNORE, Task, check_int, check_split, register


def cube(m: int) -> Tensor:
    """(2^m, m) the ±1 code of each id: bit i of the id, 0 → −1 and 1 → +1."""
    ids = torch.arange(2 ** m)[:, None]
    return ((ids >> torch.arange(m)) & 1).to(torch.float32) * 2 - 1


@register
@dataclass(frozen=True)
class BindCodes(Task):
    """Metrics: ``val_loss`` and ``accuracy`` at the query positions."""

    name = "bind_codes"
    version = 1
    model_kind = "decoder"

    seq_len: int | None = None  # derived: n_items + n_queries
    m: int = 3
    n_items: int | None = None  # default: min(2^m, 8)
    n_queries: int = 4

    def __post_init__(self) -> None:
        check_int(self, "m", 1, 8)
        if self.n_items is None:
            object.__setattr__(self, "n_items", min(2 ** self.m, 8))
        check_int(self, "n_items", 1, 2 ** self.m)
        check_int(self, "n_queries", 1, self.n_items)
        need = self.n_items + self.n_queries
        if self.seq_len is None:
            object.__setattr__(self, "seq_len", need)
        super().__post_init__()
        if self.seq_len != need:
            raise ValueError(f"bind_codes.seq_len: {self.seq_len} must equal n_items + n_queries "
                             f"= {need} (or be left out)")

    @property
    def n_codes(self) -> int:
        return 2 ** self.m

    @property
    def chance(self) -> float:
        """Accuracy of guessing one of the 2^m values."""
        return 1.0 / self.n_codes

    @property
    def d_vocab(self) -> int:
        return self.n_codes ** 2 + 2 * self.n_codes

    @property
    def query_base(self) -> int:
        return self.n_codes ** 2

    @property
    def answer_base(self) -> int:
        return self.n_codes ** 2 + self.n_codes

    def input_codes(self) -> Tensor:
        """(d_vocab, 2m) each token's fixed input: item (k, v) → [k, v], query k → [k, 0],
        answer v → [0, v] (answers are only predicted, never read)."""
        n, c = self.n_codes, cube(self.m)
        z = torch.zeros(n, self.m)
        items = torch.cat([c.repeat_interleave(n, 0), c.repeat(n, 1)], dim=1)  # id k*n + v
        return torch.cat([items, torch.cat([c, z], 1), torch.cat([z, c], 1)])

    def batch(self, split: str, batch_size: int, generator: torch.Generator) -> dict[str, Tensor]:
        check_split(self, split)  # every batch is fresh; the split only names the stream
        B, n, g = batch_size, self.n_codes, generator
        keys = torch.rand(B, n, generator=g, dtype=torch.float64).argsort(1)[:, :self.n_items]
        vals = torch.randint(0, n, (B, self.n_items), generator=g)
        pick = torch.rand(B, self.n_items, generator=g, dtype=torch.float64).argsort(1)
        pick = pick[:, :self.n_queries]  # which items are queried, in query order
        idx = torch.cat([keys * n + vals, self.query_base + keys.gather(1, pick)], dim=1)
        targets = torch.full_like(idx, IGNORE)
        targets[:, self.n_items:] = self.answer_base + vals.gather(1, pick)
        return {"idx": idx, "targets": targets}
