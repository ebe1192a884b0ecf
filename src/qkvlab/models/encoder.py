"""Bidirectional encoder with an MLM head, and the original encoder-decoder Transformer.

Shapes: src (B, S), tgt (B, T) token ids; padding masks bool, True for real tokens.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from qkvlab.kernels import Linear, gemv
from qkvlab.models.blocks import Block, Embedding, attention_modules, init_and_tie, rotary_for
from qkvlab.models.config import ModelConfig
from qkvlab.models.lm import pick_next


class Encoder(nn.Module):
    """Bidirectional stack (role ``encoder``) with a tied masked-LM head: logits (B, S, V)."""

    kind = "encoder"

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.embed = Embedding(cfg)
        self.rope = rotary_for(cfg, "encoder")
        self.blocks = nn.ModuleList(Block(cfg, "encoder") for _ in range(cfg.n_layers))
        self.ln_f = nn.LayerNorm(cfg.d_model, bias=cfg.bias)
        self.lm_head = Linear(cfg.d_model, cfg.d_vocab, bias=False)
        init_and_tie(self, cfg)

    def encode(self, idx: Tensor, key_padding_mask: Tensor | None = None) -> Tensor:
        """Hidden states (B, S, D) after the final LayerNorm."""
        x = self.embed(idx)
        for blk in self.blocks:
            x = blk(x, key_padding_mask=key_padding_mask, rope=self.rope)
        return self.ln_f(x)

    def forward(self, idx: Tensor, key_padding_mask: Tensor | None = None) -> Tensor:
        return self.lm_head(self.encode(idx, key_padding_mask))

    def attention_layers(self):
        yield from attention_modules(self.blocks, "encoder")


class EncoderDecoder(nn.Module):
    """Encoder self-attention, decoder causal self-attention and cross-attention.

    One vocabulary and one embedding for source and target (a joint tokenizer), tied to the
    output layer.
    """

    kind = "encdec"

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.embed = Embedding(cfg)
        self.enc_rope, self.dec_rope = rotary_for(cfg, "encoder"), rotary_for(cfg, "decoder")
        self.encoder = nn.ModuleList(Block(cfg, "encoder") for _ in range(cfg.n_layers))
        self.ln_enc = nn.LayerNorm(cfg.d_model, bias=cfg.bias)
        self.decoder = nn.ModuleList(Block(cfg, "decoder", cross=True) for _ in range(cfg.n_layers))
        self.ln_f = nn.LayerNorm(cfg.d_model, bias=cfg.bias)
        self.lm_head = Linear(cfg.d_model, cfg.d_vocab, bias=False)
        init_and_tie(self, cfg)

    def encode(self, src: Tensor, src_key_padding_mask: Tensor | None = None) -> Tensor:
        x = self.embed(src)
        for blk in self.encoder:
            x = blk(x, key_padding_mask=src_key_padding_mask, rope=self.enc_rope)
        return self.ln_enc(x)

    def decode(self, tgt: Tensor, memory: Tensor, *, src_key_padding_mask=None,
               tgt_key_padding_mask=None, caches=None, cross_caches=None) -> Tensor:
        offset = caches[0].length if caches else 0
        x = self.embed(tgt, offset)
        for i, blk in enumerate(self.decoder):
            x = blk(x, memory=memory, key_padding_mask=tgt_key_padding_mask,
                    memory_padding_mask=src_key_padding_mask, rope=self.dec_rope,
                    cache=caches[i] if caches else None,
                    cross_cache=cross_caches[i] if cross_caches else None)
        return self.lm_head(self.ln_f(x))

    def forward(self, src: Tensor, tgt: Tensor, src_key_padding_mask: Tensor | None = None,
                tgt_key_padding_mask: Tensor | None = None) -> Tensor:
        """Teacher-forced logits (B, T, V) for target inputs ``tgt``."""
        memory = self.encode(src, src_key_padding_mask)
        return self.decode(tgt, memory, src_key_padding_mask=src_key_padding_mask,
                           tgt_key_padding_mask=tgt_key_padding_mask)

    @torch.no_grad()
    def generate(self, src: Tensor, max_new_tokens: int, bos_id: int, eos_id: int | None = None,
                 src_key_padding_mask: Tensor | None = None) -> Tensor:
        """Greedy decode with self- and cross-attention caches: (B, 1 + new) starting at BOS.

        Rows that produced ``eos_id`` keep emitting it; stops early when every row has.
        """
        B = src.shape[0]
        if max_new_tokens + 1 > self.cfg.n_ctx:
            raise ValueError(f"max_new_tokens: {max_new_tokens} + BOS exceeds "
                             f"n_ctx={self.cfg.n_ctx}")
        memory = self.encode(src, src_key_padding_mask)
        dtype = memory.dtype
        caches = [b.attn.new_cache(B, max_new_tokens + 1, dtype=dtype) for b in self.decoder]
        cross = [b.cross.new_cache(B, src.shape[1], dtype=dtype, frozen=True) for b in self.decoder]
        out = torch.full((B, 1), bos_id, dtype=torch.long, device=src.device)
        step, done = out, torch.zeros(B, dtype=torch.bool, device=src.device)
        # few-row products on the kernel measured faster for the decoder's matrices (kernels.gemv)
        decoder = nn.ModuleList([self.decoder, self.lm_head])
        with gemv.use(gemv.decode_kernel(self, decoder, rows=B)):
            for _ in range(max_new_tokens):
                logits = self.decode(step, memory, src_key_padding_mask=src_key_padding_mask,
                                     caches=caches, cross_caches=cross)[:, -1]
                step = pick_next(logits, greedy=True)
                if eos_id is not None:
                    step = step.masked_fill(done[:, None], eos_id)
                    done |= step[:, 0] == eos_id
                out = torch.cat([out, step], dim=1)
                if eos_id is not None and bool(done.all()):
                    break
        return out

    def attention_layers(self):
        for name, role, m in attention_modules(self.encoder, "encoder"):
            yield f"encoder.{name}", role, m
        for name, role, m in attention_modules(self.decoder, "decoder"):
            yield f"decoder.{name}", role, m
