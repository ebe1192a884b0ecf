"""What every benchmark runs on: the two model sizes, qkvlab's decoder at a size, and its data
(a fixed random bigram language, so loss curves mean something). Shapes: B batch, T n_ctx."""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from qkvlab.models import DecoderLM, ModelConfig

VOCAB = 65  # character-level, as nanoGPT's Shakespeare benchmark


@dataclass(frozen=True)
class Size:
    """A benchmark model size and its training batch."""

    name: str
    n_layers: int
    n_heads: int
    d_model: int
    n_ctx: int
    batch: int


SIZES = {
    "small": Size("small", 4, 4, 128, 64, 12),
    "large": Size("large", 6, 6, 384, 256, 8),
}


@functools.lru_cache(maxsize=8)
def bigram_batches(s: Size, n: int, seed: int = 0) -> list[torch.Tensor]:
    """``n`` batches (B, n_ctx + 1) from a fixed random bigram language: learnable text-like
    data, so loss curves mean something (uniform random tokens can only be memorized)."""
    g = torch.Generator().manual_seed(seed)
    trans = torch.softmax(3 * torch.randn(VOCAB, VOCAB, generator=g), dim=-1)
    out = []
    for _ in range(n):
        seq = [torch.randint(0, VOCAB, (s.batch,), generator=g)]
        for _ in range(s.n_ctx):
            seq.append(torch.multinomial(trans[seq[-1]], 1, generator=g)[:, 0])
        out.append(torch.stack(seq, 1))
    return tuple(out)


def qkvlab_lm(s: Size, **opts) -> DecoderLM:
    """qkvlab's DecoderLM at size ``s`` (``opts``: ModelConfig options, e.g. a peer's settings)."""
    return DecoderLM(ModelConfig(d_vocab=VOCAB, n_ctx=s.n_ctx, d_model=s.d_model,
                                 n_layers=s.n_layers, n_heads=s.n_heads, **opts))


def lm_loss(model):
    """``loss(x, y)``: next-token cross-entropy of ``model``'s logits (B, T, V) on targets
    (B, T)."""
    return lambda x, y: F.cross_entropy(model(x).flatten(0, 1), y.flatten())


def train_batches(s: Size, n: int, seed: int = 0) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """``n`` (inputs, targets) pairs, each (B, n_ctx) and contiguous, as a data loader gives."""
    return [(b[:, :-1].contiguous(), b[:, 1:].contiguous()) for b in bigram_batches(s, n, seed)]
