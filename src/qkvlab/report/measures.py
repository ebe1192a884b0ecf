"""What the study measures on trained models besides their loss, one function each.

Every function takes models or configs and returns a flat ``{name: float}`` that the study
records in the results store (``sources.measure``). Shapes: B batch, T tokens, H heads,
d head width.
"""

from __future__ import annotations

import time
from collections.abc import Iterable

import torch
from torch import Tensor, nn

from qkvlab.bench import attention_layer_speed, fold_compare, interleaved


class _Capture:
    """Forward hooks on every attention layer: its input x and its attention weights.

    Turns on ``need_weights`` for the layers (as the scale probe does) and hands the plain
    output back to the block, so the model's forward is unchanged.
    """

    def __init__(self, model: nn.Module):
        self.layers = list(model.attention_layers())
        self.data: dict[str, dict[str, Tensor]] = {}
        self.handles = []
        for name, _, att in self.layers:
            self.handles.append(att.register_forward_pre_hook(self._pre(name), with_kwargs=True))
            self.handles.append(att.register_forward_hook(self._post(name), with_kwargs=True))

    def _pre(self, name):
        def pre(module, args, kwargs):
            self.data[name] = {"x": args[0].detach()}
            return args, {**kwargs, "need_weights": True}
        return pre

    def _post(self, name):
        def post(module, args, kwargs, output):
            out, w = output
            self.data[name]["w"] = w.detach()  # (B, H, Tq, Tk)
            return out
        return post

    def close(self) -> None:
        for h in self.handles:
            h.remove()


@torch.no_grad()
def own_position_weight(model: nn.Module, idx: Tensor) -> dict[str, float]:
    """Mean attention weight a causal self-attention head puts on its own position.

    Row 0 (one visible key, weight 1 by construction) is left out. ``uniform`` is what a
    head that spreads evenly over its visible keys would put there, for scale. A tied Q=K head
    scores its own token x·W·Wᵀ·x ≥ 0 (a squared norm), so without the self-mask it is pulled
    toward itself (Kitaev et al. 2020, Reformer).
    """
    cap = _Capture(model)
    try:
        model(idx)
    finally:
        cap.close()
    own = []
    for d in cap.data.values():
        w = d["w"]  # (B, H, T, T)
        diag = torch.diagonal(w, dim1=-2, dim2=-1)[..., 1:]  # (B, H, T-1)
        own.append(diag.mean().item())
    T = idx.shape[1]
    uniform = (1.0 / torch.arange(2, T + 1, dtype=torch.float64)).mean().item()
    return {"own_weight": sum(own) / len(own), "uniform": uniform}


@torch.no_grad()
def convex_range(model: nn.Module, idx: Tensor) -> dict[str, float]:
    """How far each head's output (before W_O) leaves the range of the values it attends to.

    Standard: z_i = Σ_j a_ij v_j with a_ij ≥ 0, Σ_j a_ij = 1, so every coordinate of z_i lies
    between the min and max of that coordinate over the visible values (seed 001's answer).
    ``alt`` applies W_hᵀ/√d_k after the sum, which has no such guarantee.

    Returns:
        ``outside_share``: share of output coordinates outside [min_j v_j, max_j v_j] (with a
        1e-5 relative tolerance for float error); ``range_ratio``: mean over heads and
        coordinates of (output range over tokens) / (value range over tokens).
    """
    cap = _Capture(model)
    try:
        model(idx)
    finally:
        cap.close()
    outside, ratio = [], []
    for name, _, att in cap.layers:
        x, w = cap.data[name]["x"], cap.data[name]["w"]
        v = _expand(att.project(x)[2], att.cfg.n_heads)  # (B, H, T, d)
        z = att.mix(w @ v) * att.cfg.outer_scale  # (B, H, T, d): the head's output
        # visible values of query i are keys 0..i (causal): running min / max over keys
        vmin, vmax = torch.cummin(v, dim=2).values, torch.cummax(v, dim=2).values
        tol = 1e-5 * (vmax - vmin).abs().amax().clamp_min(1e-12)
        outside.append(((z < vmin - tol) | (z > vmax + tol)).double().mean().item())
        zr = z.amax(2) - z.amin(2)
        vr = (v.amax(2) - v.amin(2)).clamp_min(1e-12)
        ratio.append((zr / vr).mean().item())
    return {"outside_share": sum(outside) / len(outside), "range_ratio": sum(ratio) / len(ratio)}


def _expand(t: Tensor, n_heads: int) -> Tensor:
    """(B, G, T, d) -> (B, H, T, d) for GQA layers."""
    g = t.shape[1]
    return t if g == n_heads else t.repeat_interleave(n_heads // g, dim=1)


def fold_check(alt: nn.Module, idx: Tensor, rounds: int = 5) -> dict[str, float]:
    """Fold a trained ``alt`` model into ``standard`` and compare (``qkvlab.bench.fold_compare``)."""
    return fold_compare(alt, idx, rounds)


def variant_configs(d_model: int, n_layers: int, n_heads: int, n_ctx: int,
                    variants: dict[str, dict]) -> dict[str, object]:
    """ModelConfig per variant label (model options as in the experiments' specs)."""
    from qkvlab.models import ModelConfig

    return {k: ModelConfig(d_vocab=256, n_ctx=n_ctx, d_model=d_model, n_layers=n_layers,
                           n_heads=n_heads, **opts) for k, opts in variants.items()}


def attention_speed(d_model: int, n_heads: int, T: int, B: int, variants: dict[str, dict],
                    iters: int = 3, rounds: int = 5, seed: int = 0) -> dict[str, float]:
    """Forward+backward time of one causal self-attention layer per variant relative to
    ``standard`` (> 1 = slower) and parameter counts, flattened as ``label/measure``."""
    torch.manual_seed(seed)
    res = attention_layer_speed(d_model, n_heads, T, B, variants, iters=iters, rounds=rounds)
    return {f"{label}/{k}": v for label, r in res.items() for k, v in r.items()
            if k != "flops_vs_standard"}


@torch.no_grad()
def decode_speed(configs: dict[str, object], new_tokens: int, rounds: int = 3,
                 seed: int = 0) -> dict[str, float]:
    """Batch-1 greedy decoding tokens/s with the KV cache, and KV-cache bytes per token.

    Untrained weights: decoding speed does not depend on what the weights learned.
    """
    from qkvlab.models import DecoderLM

    fns, out = {}, {}
    prompt = torch.randint(0, 256, (1, 8), generator=torch.Generator().manual_seed(seed))
    for label, cfg in configs.items():
        torch.manual_seed(seed)
        model = DecoderLM(cfg).eval()
        out[f"{label}/cache_bytes_per_token"] = model.cache_bytes(1, 1)

        def run(m=model) -> float:
            t = time.perf_counter()
            m.generate(prompt, new_tokens, greedy=True)
            return new_tokens / (time.perf_counter() - t)
        fns[label] = run
    for k, v in interleaved(fns, rounds).items():
        out[f"{k}/decode_tokens_per_s"] = v
    return out


def first_batch(task, split: str, batch_size: int, seed: int = 0) -> dict[str, Tensor]:
    """One deterministic batch of ``split`` (the same for every design compared)."""
    return task.batch(split, batch_size, torch.Generator().manual_seed(seed))


def mean_of(dicts: Iterable[dict[str, float]]) -> dict[str, float]:
    """Key-wise mean of several result dicts (keys present in all)."""
    ds = list(dicts)
    keys = set.intersection(*(set(d) for d in ds)) if ds else set()
    return {k: sum(d[k] for d in ds) / len(ds) for k in sorted(keys)}
