"""What the study measures besides training, one function each.

Every function returns records (a dict, or a list of dicts: one table row each) that the study
stores as one measure (``Store.measure``); ``results.StudyData.measure(name)`` reads them back
as a DataFrame. Columns per measure (besides the tags of the run a measure reads):
    fold_alt          max_abs_diff_fp32, max_abs_diff_fp64, max_abs_logit, params_alt,
                      params_folded, speed_folded_vs_alt
    convex_range      outside_share, range_ratio
    own_position      own_weight, uniform
    symmetry_steps    role, step, symmetry
    attention_speed   design, time_vs_standard, flops_vs_standard, params_vs_standard, ...
    decode_speed      design, cache_bytes_per_token, decode_tokens_per_s
    kv_decode         context, batch, design (a cache layout: standard, tied_kv, tied_qkv,
                      gqa_G with G kv heads, mqa), kernel, tokens_per_s, tokens_per_s_sdpa,
                      ratio (to standard), ratio_min, ratio_max, cache_bytes, weight_bytes,
                      cache_share, bound_tokens_per_s, attention_cache_gb_s, cache_read_gb_s,
                      copy_gb_s
    pretrained        level (summary | layer), role, measure, and mean, std, null_mean,
                      null_std, null_lo, null_hi, share_above_null, n_heads (summary) or
                      layer, value (layer)
    weight_similarity role, measure, and the summary fields of ``pretrained``
Shapes: B batch, T tokens, H heads, d head width.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import Tensor, nn

from qkvlab.analysis import analyze, measures
from qkvlab.analysis.load_qkvlab import load_qkvlab
from qkvlab.attention import repeat_kv
from qkvlab.models import DecoderLM, ModelConfig
from qkvlab.models.speed import attention_layer_speed, fold_compare, kv_decode_speed
from qkvlab.timing import interleaved, rate


# Bump when a measure's code changes meaning: old stored values are then recomputed (every
# record's spec holds it as ``version``, and the report reads only the current version's).
MEASURE_VERSION = 2

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
        v = repeat_kv(att.project(x)[2], att.cfg.n_heads, dim=1)  # (B, H, T, d)
        z = att.mix(w @ v) * att.cfg.outer_scale  # (B, H, T, d): the head's output
        # visible values of query i are keys 0..i (causal): running min / max over keys
        vmin, vmax = torch.cummin(v, dim=2).values, torch.cummax(v, dim=2).values
        tol = 1e-5 * (vmax - vmin).abs().amax().clamp_min(1e-12)
        outside.append(((z < vmin - tol) | (z > vmax + tol)).double().mean().item())
        zr = z.amax(2) - z.amin(2)
        vr = (v.amax(2) - v.amin(2)).clamp_min(1e-12)
        ratio.append((zr / vr).mean().item())
    return {"outside_share": sum(outside) / len(outside), "range_ratio": sum(ratio) / len(ratio)}


def fold_check(alt: nn.Module, idx: Tensor, rounds: int = 5) -> dict[str, float]:
    """Fold a trained ``alt`` model into ``standard`` and compare
    (``qkvlab.models.speed.fold_compare``)."""
    return fold_compare(alt, idx, rounds)


def variant_configs(d_model: int, n_layers: int, n_heads: int, n_ctx: int,
                    variants: dict[str, dict]) -> dict[str, ModelConfig]:
    """ModelConfig per variant label (model options as in the experiments' specs)."""
    return {k: ModelConfig(d_vocab=256, n_ctx=n_ctx, d_model=d_model, n_layers=n_layers,
                           n_heads=n_heads, **opts) for k, opts in variants.items()}


def attention_speed(d_model: int, n_heads: int, T: int, B: int, variants: dict[str, dict],
                    iters: int = 3, rounds: int = 5, seed: int = 0) -> list[dict]:
    """Forward+backward time of one causal self-attention layer per variant relative to
    ``standard`` (> 1 = slower) and parameter counts: one record per design."""
    torch.manual_seed(seed)
    res = attention_layer_speed(d_model, n_heads, T, B, variants, iters=iters, rounds=rounds)
    return [{"design": label, **r} for label, r in res.items()]


@torch.no_grad()
def decode_speed(configs: dict[str, ModelConfig], new_tokens: int, rounds: int = 3,
                 seed: int = 0) -> list[dict]:
    """Batch-1 greedy decoding tokens/s with the KV cache, and KV-cache bytes per token: one
    record per design. Untrained weights: decoding speed does not depend on what they learned."""
    fns, cache = {}, {}
    prompt = torch.randint(0, 256, (1, 8), generator=torch.Generator().manual_seed(seed))
    for label, cfg in configs.items():
        torch.manual_seed(seed)
        model = DecoderLM(cfg).eval()
        cache[label] = model.cache_bytes(1, 1)
        fns[label] = rate(lambda m=model: m.generate(prompt, new_tokens, greedy=True),
                          work=new_tokens)
    speed = interleaved(fns, rounds)
    return [{"design": k, "cache_bytes_per_token": cache[k], "decode_tokens_per_s": speed[k]}
            for k in configs]


def kv_decode(contexts: tuple[int, ...], batches: tuple[int, ...], rounds: int) -> list[dict]:
    """Q3's payoff curve: one decode step's tokens/s per cache layout against context and batch,
    where the cache, not the weights, becomes the cost (``models.speed.kv_decode_speed``, the
    same function as ``qkvlab bench --only kv``)."""
    return kv_decode_speed(contexts, batches, rounds=rounds)


def symmetry_steps(files: dict[int, Path]) -> list[dict]:
    """Mean symmetry score of W_QK over heads, per attention role, of each kept checkpoint
    (``{step: path}``): one record per (step, role)."""
    if not files:
        raise ValueError("the run kept no intermediate models (train.keep_at)")
    out = []
    for step, path in files.items():
        by: dict[str, list[float]] = {}
        for lay in load_qkvlab(path).layers:
            by.setdefault(lay.role, []).extend(measures.symmetry_score(lay.W_Q, lay.W_K).tolist())
        out += [{"step": step, "role": role, "symmetry": sum(v) / len(v)} for role, v in by.items()]
    return out


SUMMARY_FIELDS = ("mean", "std", "null_mean", "null_std", "null_lo", "null_hi",
                  "share_above_null", "n_heads")


def pretrained(source: str, n_null: int, cka: bool) -> list[dict]:
    """``qkvlab.analysis.analyze`` of a built-in model: its summary per role × measure against
    the random null, and the mean over heads per layer × measure."""
    res = analyze(source, None, n_null=n_null, cka=cka, figures=False, progress=False)
    out = [{"level": "summary", "role": r["role"], "measure": r["measure"],
            **{k: r[k] for k in SUMMARY_FIELDS}} for r in res["summary"]]
    per: dict[tuple, list[float]] = {}
    for r in res["rows"]:
        per.setdefault((r["role"], r["layer"], r["measure"]), []).append(r["value"])
    out += [{"level": "layer", "role": role, "layer": layer, "measure": m,
             "value": sum(v) / len(v)} for (role, layer, m), v in per.items()]
    return out


def weight_similarity(path: Path, n_null: int) -> list[dict]:
    """How similar W_Q, W_K and W_V are in one trained qkvlab model: per attention role and
    measure (symmetry of W_QK, Q–K, K–V and Q–V subspace overlaps), the mean over heads beside
    the random null of the same shapes (``qkvlab.analysis.analyze`` on the checkpoint)."""
    res = analyze(str(path), None, n_null=n_null, cka=False, figures=False, progress=False)
    return [{"role": r["role"], "measure": r["measure"], **{k: r[k] for k in SUMMARY_FIELDS}}
            for r in res["summary"]]


def first_batch(task, split: str, batch_size: int, seed: int = 0) -> dict[str, Tensor]:
    """One deterministic batch of ``split`` (the same for every design compared)."""
    return task.batch(split, batch_size, torch.Generator().manual_seed(seed))
