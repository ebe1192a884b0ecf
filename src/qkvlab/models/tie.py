"""Convert a trained qkvlab model's attention to tied K = V: the first step of converting a model
whose pretraining is ours (the controlled conversion; ``qkvlab.hf.tie`` does the same for
Hugging Face decoders).

A ``standard`` layer computes, per query head h of kv group g, softmax(s·Q_h K_gᵀ)·V_g·W_O[h].
A ``tied_kv`` layer has one projection per group, K_g = V_g = S·W_g. The starts:

- ``fitted``: keep W_g = W_K[g] (the scores are unchanged) and fit V_g ≈ K_g·M_g by least squares
  on real activations, M_g = (W_K̂ᵀ C W_K̂)⁻¹ W_K̂ᵀ C W_V̂ with C = E[x̂ x̂ᵀ] the second moment of
  the layer's input (x̂ = [x, 1] where the layer has biases), in float64; M_g is folded into the
  output map, W_O'[h] = M_g·W_O[h], which is exact algebra (a linear map after the attention
  weights). Where V_g already is K_g·M for some M the converted layer is the same function.
- ``keep_k`` / ``keep_v`` / ``avg``: W_g = W_K, W_V or their mean, W_O untouched (Kayyam et al.'s
  starts).

A decoder LM is converted (``DecoderLM``: its blocks' self-attention); its config becomes
``tied_kv`` so the converted model saves, loads and decodes with one cache tensor per layer.
"""

from __future__ import annotations

import copy

import torch
from torch import Tensor, nn

from qkvlab.attention import Attention, build_attention

STARTS = ("fitted", "keep_k", "keep_v", "avg")


def _self_attention(model: nn.Module) -> list[tuple[nn.Module, str, Attention]]:
    """(block, "attn", layer) of every self-attention layer of a qkvlab decoder LM."""
    if getattr(model, "kind", None) != "decoder":
        raise ValueError(f"model: {type(model).__name__} is not a qkvlab decoder LM (DecoderLM)")
    return [(b, "attn", b.attn) for b in model.blocks]


@torch.no_grad()
def moments(model: nn.Module, batches) -> list[Tensor]:
    """Per layer, E[x̂ x̂ᵀ] (float64, on the CPU) of the self-attention input over ``batches``
    (an iterable of token id tensors, each passed as ``model(ids)``)."""
    layers = [a for _, _, a in _self_attention(model)]
    sums = [torch.zeros(a.cfg.d_model + 1, a.cfg.d_model + 1, dtype=torch.float64)
            for a in layers]
    count = [0]

    def hook(i):
        def pre(module, args):
            x = args[0].reshape(-1, args[0].shape[-1]).double()
            xh = torch.cat([x, x.new_ones(len(x), 1)], 1)
            sums[i] += (xh.T @ xh).cpu()
            if i == 0:
                count[0] += len(x)
        return pre

    handles = [a.register_forward_pre_hook(hook(i)) for i, a in enumerate(layers)]
    was = model.training
    model.eval()
    try:
        for ids in batches:
            model(ids)
    finally:
        for h in handles:
            h.remove()
        model.train(was)
    if not count[0]:
        raise ValueError("calibration: no tokens were seen")
    return [s / count[0] for s in sums]


def _group_weights(a: Attention, role: str) -> Tensor:
    """(G, d, D+1): the role's per-kv-group projection with its bias as the last column."""
    seg = a.segment_of(role)
    n, d = a._shape[seg]
    w = a.W_in[a._slices[seg]].view(n, d, a.cfg.d_model)
    b = (a.b_in[a._slices[seg]].view(n, d, 1) if a.b_in is not None
         else w.new_zeros(n, d, 1))
    return torch.cat([w, b], -1)


@torch.no_grad()
def tie_kv_layer(a: Attention, C: Tensor | None = None, start: str = "fitted") -> Attention:
    """A ``tied_kv`` copy of the ``standard`` layer ``a`` from ``start`` (see the module);
    ``C``: the layer's input moment (``moments``), needed by ``fitted``."""
    cfg = a.cfg
    if a.segments != ("q", "k", "v") or a.mix_matrices() is not None or cfg.outer_scale != 1:
        raise ValueError(f"design: only a standard layer (separate Q, K, V, nothing between the "
                         f"softmax and W_O) converts to tied_kv, not {cfg.design!r}")
    if cfg.d_v != cfg.d_head:
        raise ValueError(f"d_v: tied_kv needs d_v = d_head ({cfg.d_v} != {cfg.d_head})")
    if start not in STARTS:
        raise ValueError(f"start: {start!r} is not one of {STARTS}")
    if start == "fitted" and C is None:
        raise ValueError("start 'fitted' needs the layer's input moment C (models.tie.moments)")
    K, V = _group_weights(a, "k").double(), _group_weights(a, "v").double()  # (G, d, D+1)
    G, H, d, D = K.shape[0], cfg.n_heads, cfg.d_head, cfg.d_model
    shared = {"fitted": K, "keep_k": K, "keep_v": V, "avg": (K + V) / 2}[start]
    w_o = a.out_proj.weight.double().T.reshape(H, d, D)  # (H, dv, D)
    if start == "fitted":
        Cd = C.to(torch.float64)
        M = torch.linalg.solve(K @ Cd @ K.transpose(1, 2), K @ Cd @ V.transpose(1, 2))  # (G,d,d)
        w_o = M.repeat_interleave(H // G, dim=0) @ w_o  # head h reads kv group h // (H/G)
    new = build_attention(cfg.replace(design="tied_kv")).to(a.W_in.device, a.W_in.dtype)
    q = a.W_in[a._slices["q"]]
    new.W_in.copy_(torch.cat([q, shared[..., :D].reshape(G * d, D).to(q)], 0))
    if new.b_in is not None:
        new.b_in.copy_(torch.cat([a.b_in[a._slices["q"]],
                                  shared[..., D].reshape(G * d).to(a.b_in)], 0))
    new.out_proj.weight.copy_(w_o.reshape(H * d, D).T.to(new.out_proj.weight))
    if a.out_proj.bias is not None:
        new.out_proj.bias.copy_(a.out_proj.bias)
    new.train(a.training)
    return new


def tie_kv(model: nn.Module, batches=None, start: str = "fitted") -> nn.Module:
    """A copy of the qkvlab decoder ``model`` with every self-attention layer tied K = V from
    ``start``; ``batches`` (token ids, as ``moments`` takes them) calibrate ``fitted``. The
    copy's config says ``tied_kv``."""
    if start not in STARTS:
        raise ValueError(f"start: {start!r} is not one of {STARTS}")
    Cs = moments(model, batches) if start == "fitted" else None
    new = copy.deepcopy(model)
    for i, (parent, name, a) in enumerate(_self_attention(new)):
        setattr(parent, name, tie_kv_layer(a, None if Cs is None else Cs[i], start))
    roles = dict(new.cfg.roles)  # a decoder role of its own says tied_kv too; none is added
    if "decoder" in roles:
        roles["decoder"] = {**roles["decoder"], "design": "tied_kv"}
    new.cfg = new.cfg.replace(design="tied_kv", roles=roles)
    return new
