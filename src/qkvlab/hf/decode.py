"""Decoding of a Hugging Face Llama-family model whose K=V layers keep one cache tensor.

``qkvlab.hf.tie.tie(model, "kv", ...)`` makes ``v_proj`` share ``k_proj``'s Parameters, and HF
rotates k but never v, so in such a layer v is the pre-rotary k. HF's own cache does not know
that and stores k (rotated) and v (= the pre-rotary k) for every layer. :func:`generate` runs
the same model with a cache of its own: a K=V layer keeps ONE tensor, the pre-rotary k, read
once per step as the values and, rotated block by block as it is read, as the keys
(``kernels.attend.decode_attention`` with ``rope``, the Triton kernel on a GPU); an untied layer
keeps k (rotated) and v, as HF does. The identity that lets the rotation move into the score
product (rotate-half layout, R_p orthogonal, R_iᵀ R_j = R_{j−i}):

    ⟨R_i q, R_j k_j⟩ = qᵀ R_{j−i} k_j = ⟨R_{i−j} q, k_j⟩.

It calls the model's own modules (projections, norms, MLP, rotary tables from
``model.model.rotary_emb``) and re-implements only the attention step, so it is written for the
families whose decoder layer is Llama's: ``llama``, ``mistral``, ``qwen2`` (biases on q/k/v),
which covers SmolLM. No sliding window shorter than the sequence, no rotary type whose tables
change with the length (``dynamic``, ``longrope``): those raise ``ValueError``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from qkvlab.kernels.attend import decode_attention, rotate
from qkvlab.models.lm import pick_next

FAMILIES = ("llama", "mistral", "qwen2")
DYNAMIC_ROPE = ("dynamic", "longrope")


@dataclass
class Decoded:
    """What :func:`generate` returns."""
    tokens: Tensor  # (B, T + n): the prompt, then the n new tokens
    logits: Tensor  # (B, n, V): the logits each new token was picked from
    cache_bytes: list[int]  # per layer: bytes of the storage its cache tensors hold
    shared: list[bool]  # per layer: one tensor (pre-rotary k serves as k and v), else k and v


def kv_tied(attn: nn.Module) -> bool:
    """Whether an HF attention module's v is its pre-rotary k: ``v_proj`` holds ``k_proj``'s
    very Parameters (weight, and bias where there is one), as ``tie(model, "kv")`` leaves it."""
    k, v = attn.k_proj, attn.v_proj
    return v.weight is k.weight and v.bias is k.bias


class LayerCache:
    """One layer's cache, preallocated for ``max_len`` tokens: ``k`` (B, G, max_len, d) and
    ``v``, the same tensor where the layer is K=V (then ``k`` holds pre-rotary keys)."""

    def __init__(self, attn: nn.Module, batch: int, max_len: int, dtype, device):
        d = attn.head_dim
        G = attn.k_proj.out_features // d
        self.shared, self.length = kv_tied(attn), 0
        self.k = torch.empty(batch, G, max_len, d, dtype=dtype, device=device)
        self.v = self.k if self.shared else torch.empty_like(self.k)

    @property
    def nbytes(self) -> int:
        """Bytes of the distinct storages the cache holds (a shared tensor counts once)."""
        storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes()
                    for t in (self.k, self.v)}
        return sum(storages.values())

    def append(self, k: Tensor, v: Tensor | None) -> tuple[Tensor, Tensor]:
        """Write (B, G, T, d) keys (and values, where not shared); return all cached so far."""
        T = k.shape[2]
        self.k.narrow(2, self.length, T).copy_(k)
        if not self.shared:
            self.v.narrow(2, self.length, T).copy_(v)
        self.length += T
        return self.k.narrow(2, 0, self.length), self.v.narrow(2, 0, self.length)


def check_model(model: nn.Module, total: int) -> None:
    """Refuse what :func:`generate` does not reproduce (``ValueError`` saying why)."""
    cfg = getattr(model, "config", None)
    mtype = getattr(cfg, "model_type", None)
    if mtype not in FAMILIES:
        raise ValueError(f"model: model_type {mtype!r} is not supported; supported: "
                         f"{list(FAMILIES)} (decoder layers as Llama's)")
    window, types = getattr(cfg, "sliding_window", None), getattr(cfg, "layer_types", None)
    sliding = types is None or "sliding_attention" in types
    if window is not None and sliding and total > window:
        raise ValueError(f"max_new_tokens: {total} tokens exceed the sliding window {window}, "
                         "which this decoder does not apply")
    rope = getattr(cfg, "rope_parameters", None) or getattr(cfg, "rope_scaling", None) or {}
    kind = rope.get("rope_type", rope.get("type", "default")) if isinstance(rope, dict) else None
    if kind in DYNAMIC_ROPE:
        raise ValueError(f"model: rotary type {kind!r} changes its tables with the length; "
                         "not supported")


def _attention(attn: nn.Module, x: Tensor, cache: LayerCache, cos: Tensor,
               sin: Tensor) -> Tensor:
    """One attention call of a Llama-style layer on x (B, T, D) at positions cache.length + t;
    cos, sin (max_len, d) are the model's rotary tables."""
    B, T, _ = x.shape
    d, pos = attn.head_dim, cache.length
    c, s = cos[pos:pos + T], sin[pos:pos + T]
    q = rotate(attn.q_proj(x).view(B, T, -1, d).transpose(1, 2), c, s)
    k = attn.k_proj(x).view(B, T, -1, d).transpose(1, 2)  # pre-rotary
    if cache.shared:  # the cache holds pre-rotary k, which is v
        keys, values = cache.append(k, None)
    else:
        v = attn.v_proj(x).view(B, T, -1, d).transpose(1, 2)
        keys, values = cache.append(rotate(k, c, s), v)
    rope = (cos, sin) if cache.shared else None
    if T == 1:
        z = decode_attention(q, keys, values, attn.scaling, rope=rope)
    else:  # the prompt, into an empty cache: causal attention over it
        if rope is not None:
            keys = rotate(keys, cos[:keys.shape[2]], sin[:keys.shape[2]])
        z = F.scaled_dot_product_attention(q, keys, values, is_causal=True, scale=attn.scaling,
                                           enable_gqa=keys.shape[1] != q.shape[1])
    return attn.o_proj(z.transpose(1, 2).reshape(B, T, -1))


def _forward(model: nn.Module, ids: Tensor, caches: list[LayerCache], cos: Tensor,
             sin: Tensor) -> Tensor:
    """Logits (B, V) of the last position of ``ids`` (B, T), extending the caches."""
    inner = model.model
    h = inner.embed_tokens(ids)
    for layer, cache in zip(inner.layers, caches):
        h = h + _attention(layer.self_attn, layer.input_layernorm(h), cache, cos, sin)
        h = h + layer.mlp(layer.post_attention_layernorm(h))
    return model.lm_head(inner.norm(h[:, -1:]))[:, 0]


@torch.no_grad()
def generate(model: nn.Module, input_ids: Tensor, max_new_tokens: int, greedy: bool = True, *,
             temperature: float = 1.0, top_k: int | None = None,
             generator: torch.Generator | None = None) -> Decoded:
    """Extend ``input_ids`` (B, T; no padding) by ``max_new_tokens`` tokens of ``model``, an HF
    Llama/Mistral/Qwen2 causal LM (e.g. tied with ``qkvlab.hf.tie.tie(model, "kv", ...)``):
    greedy (argmax, as HF's ``generate(do_sample=False)``), else sampled at ``temperature``
    from the ``top_k`` most likely. K=V layers keep one cache tensor (the pre-rotary k), the
    others k and v; :attr:`Decoded.cache_bytes` is measured from those tensors' storage.
    No end-of-sequence stop: exactly ``max_new_tokens`` tokens.

    Raises:
        ValueError: an unsupported model (:func:`check_model`), bad ids or token counts.
    """
    if input_ids.dim() != 2 or input_ids.dtype != torch.long or input_ids.shape[1] < 1:
        raise ValueError(f"input_ids: expected a LongTensor (batch, seq >= 1), got "
                         f"{input_ids.dtype} {tuple(input_ids.shape)}")
    if max_new_tokens < 0:
        raise ValueError(f"max_new_tokens: {max_new_tokens} must be >= 0")
    B, T = input_ids.shape
    total = T + max_new_tokens
    check_model(model, total)
    inner = model.model
    w = inner.embed_tokens.weight
    caches = [LayerCache(layer.self_attn, B, total, w.dtype, w.device) for layer in inner.layers]
    pos = torch.arange(total, device=w.device)[None]
    cos, sin = inner.rotary_emb(w[:1][None], pos)  # (1, total, d) in the model's dtype
    cos, sin = cos[0], sin[0]
    out, logits, step = input_ids, [], input_ids
    for _ in range(max_new_tokens):
        last = _forward(model, step, caches, cos, sin)
        step = pick_next(last, greedy=greedy, temperature=temperature, top_k=top_k,
                         generator=generator)
        logits.append(last)
        out = torch.cat([out, step], dim=1)
    V = model.lm_head.out_features
    stacked = torch.stack(logits, 1) if logits else w.new_empty(B, 0, V)
    return Decoded(out, stacked, [c.nbytes for c in caches], [c.shared for c in caches])
