"""``bind``: one token carries a key and a value; a query names a key, the answer is its value.

Seed 004's example: the query "network" should match the keys "neural" and "social" alike, yet
their values must differ. Attention reads the key through W_K and the value through W_V *from the
same token*; tying W_K = W_V makes one d_head-wide projection carry both, which is what this task
measures (MQAR keeps key and value on separate tokens, so it cannot).

Vocabulary (d_vocab = n_keys·n_values + n_keys + n_values):
- item ``(k, v)``: id ``k * n_values + v`` — one token, both features;
- query for key ``k``: id ``n_keys * n_values + k``;
- answer ``v``: id ``n_keys * n_values + n_keys + v``.

Keys come in groups of ``group_size`` consecutive ids ("near" keys: the same group). Per sequence
the binding is fresh: values are drawn anew, so every key recurs with different values across
sequences and must be read, not memorised. For each of ``n_queries`` queried keys (each from a
different group), ``n_near`` distractor items carry other keys of the same group and values
different from the queried key's value; the remaining items carry random unused keys and
random values. Items are shuffled; all keys in a sequence are distinct, so each query has
exactly one answer.

Layout: ``idx`` (B, T) = n_items items, then n_queries query tokens; ``targets`` (B, T) = the
answer id at each query position, ``IGNORE`` elsewhere. T = n_items + n_queries (``seq_len``
is derived; giving another value is an error). Chance accuracy = 1 / n_values.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from qkvlab.data.base import IGNORE, Task, check_int, check_split, register


def _perm(b: int, n: int, g: torch.Generator) -> Tensor:
    """(b, n) independent random permutations of range(n)."""
    return torch.rand(b, n, generator=g, dtype=torch.float64).argsort(1)


@register
@dataclass(frozen=True)
class Bind(Task):
    """Metrics: ``val_loss`` and ``accuracy`` at the query positions."""

    name = "bind"
    version = 1
    model_kind = "decoder"

    seq_len: int | None = None  # derived: n_items + n_queries
    n_keys: int = 32
    n_values: int = 16
    group_size: int = 4
    n_items: int = 16
    n_queries: int = 4
    n_near: int = 1

    @property
    def chance(self) -> float:
        """Accuracy of guessing: 1 / n_values: one of the values."""
        return 1.0 / self.n_values

    def __post_init__(self) -> None:
        for f in ("n_keys", "n_values", "group_size", "n_items", "n_queries"):
            check_int(self, f, 1 if f != "n_values" else 2)
        check_int(self, "n_near", 0, self.group_size - 1)
        need = self.n_items + self.n_queries
        if self.seq_len is None:
            object.__setattr__(self, "seq_len", need)
        super().__post_init__()
        if self.seq_len != need:
            raise ValueError(f"bind.seq_len: {self.seq_len} must equal n_items + n_queries = "
                             f"{need} (or be left out)")
        if self.n_keys % self.group_size:
            raise ValueError(f"bind.group_size: {self.group_size} must divide n_keys={self.n_keys}")
        if self.n_queries > self.n_keys // self.group_size:
            raise ValueError(f"bind.n_queries: {self.n_queries} exceeds the "
                             f"{self.n_keys // self.group_size} key groups (one group per query)")
        if not self.n_queries * (1 + self.n_near) <= self.n_items <= self.n_keys:
            raise ValueError(f"bind.n_items: {self.n_items} must lie in "
                             "[n_queries*(1+n_near), n_keys]"
                             f" = [{self.n_queries * (1 + self.n_near)}, {self.n_keys}]")

    @property
    def d_vocab(self) -> int:
        return self.n_keys * self.n_values + self.n_keys + self.n_values

    @property
    def query_base(self) -> int:
        return self.n_keys * self.n_values

    @property
    def answer_base(self) -> int:
        return self.n_keys * self.n_values + self.n_keys

    def batch(self, split: str, batch_size: int, generator: torch.Generator) -> dict[str, Tensor]:
        check_split(self, split)  # every batch is fresh; the split only names the stream
        B, g = batch_size, generator
        K, V, G, Q, N = self.n_keys, self.n_values, self.group_size, self.n_queries, self.n_near
        groups = _perm(B, K // G, g)[:, :Q]  # (B, Q) distinct groups
        members = _perm(B * Q, G, g)[:, :1 + N].view(B, Q, 1 + N)  # queried key first, then near
        near_keys = groups[:, :, None] * G + members  # (B, Q, 1 + N)

        target_val = torch.randint(0, V, (B, Q, 1), generator=g)
        # A near distractor's value differs from the queried one: add a shift in [1, V).
        shift = torch.randint(1, V, (B, Q, N), generator=g)
        near_vals = torch.cat([target_val, (target_val + shift) % V], dim=2)  # (B, Q, 1 + N)

        # Fill the remaining items with keys not used above, in random order.
        n_fill = self.n_items - Q * (1 + N)
        used = torch.zeros(B, K, dtype=torch.bool).scatter_(1, near_keys.view(B, -1), True)
        order = torch.rand(B, K, generator=g, dtype=torch.float64).masked_fill(used, 2.0).argsort(1)
        fill_keys = order[:, :n_fill]  # (B, n_fill); used keys sort last (noise < 1 < 2)
        fill_vals = torch.randint(0, V, (B, n_fill), generator=g)

        keys = torch.cat([near_keys.view(B, -1), fill_keys], dim=1)  # (B, n_items)
        vals = torch.cat([near_vals.view(B, -1), fill_vals], dim=1)
        items = (keys * V + vals).gather(1, _perm(B, self.n_items, g))  # shuffled item tokens

        idx = torch.cat([items, self.query_base + near_keys[:, :, 0]], dim=1)  # (B, T)
        targets = torch.full_like(idx, IGNORE)
        targets[:, self.n_items:] = self.answer_base + target_val[:, :, 0]
        return {"idx": idx, "targets": targets}
