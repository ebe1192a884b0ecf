"""The library's speed measurements of its own modules, for ``qkvlab bench`` and for any
measure that times them.

Each function returns ratios measured side by side in one process (``qkvlab.timing``:
contenders interleaved, median over rounds), since absolute times on a shared machine mean
little. Shapes: B batch, T tokens.
"""

from __future__ import annotations

import copy

import torch

from qkvlab.attention import DESIGNS, AttentionConfig, build_attention
from qkvlab.models.fold import fold_alt
from qkvlab.models.params import count_params
from qkvlab.timing import interleaved, rate


def projection_flops(cfg: AttentionConfig, B: int, T: int) -> int:
    """Multiply-adds ×2 of one self-attention layer: fused projection, SDPA core, W_O."""
    att = build_attention(cfg)
    rows = att.W_in.shape[0]
    proj = 2 * B * T * cfg.d_model * rows
    core = 2 * B * T * T * cfg.n_heads * (cfg.d_head + cfg.d_v)
    out = 2 * B * T * cfg.n_heads * cfg.d_v * cfg.d_model
    extra = sum(2 * B * T * p.shape[-2] * p.shape[-1] * p.shape[0]
                for n, p in att.named_parameters() if n == "W_mix")  # alt's per-head W_h
    return proj + core + out + extra


def attention_layer_speed(d_model: int, n_heads: int, T: int, B: int,
                          variants: dict[str, dict] | None = None, iters: int = 5,
                          rounds: int = 5, device: str = "cpu") -> dict[str, dict[str, float]]:
    """Forward+backward time of one causal self-attention layer per variant (label ->
    AttentionConfig options; default: every design) on ``device``, relative to ``standard``,
    beside its FLOPs and parameter ratios."""
    variants = variants or {d: {"design": d} for d in DESIGNS}
    x = torch.randn(B, T, d_model, device=device, requires_grad=True)
    fns, flops, params = {}, {}, {}
    for label, opts in {"standard": {}, **variants}.items():
        cfg = AttentionConfig(d_model=d_model, n_heads=n_heads, **opts)
        att = build_attention(cfg).to(device)
        flops[label] = projection_flops(cfg, B, T)
        params[label] = sum(p.numel() for p in att.parameters())
        fns[label] = rate(lambda att=att: att(x, is_causal=True).sum().backward(), iters=iters,
                          device=device)
    rates = interleaved(fns, rounds)
    return {k: {"time_vs_standard": rates["standard"] / rates[k],
                "flops_vs_standard": flops[k] / flops["standard"],
                "params": params[k], "params_vs_standard": params[k] / params["standard"]}
            for k in fns}


@torch.no_grad()
def fold_compare(alt, idx: torch.Tensor, rounds: int = 5) -> dict[str, float]:
    """Fold ``alt`` (a model with alt layers) into ``standard`` and compare on ``idx``.

    Max |logit difference| in fp32 and in fp64 (where what is left is the algebra, not
    rounding), both parameter counts, and forward tokens/s of each, interleaved.
    """
    folded = fold_alt(alt).eval()
    ref = alt(idx)
    diff32 = (folded(idx) - ref).abs().max().item()
    a64 = copy.deepcopy(alt).double().eval()
    diff64 = (fold_alt(a64).eval()(idx) - a64(idx)).abs().max().item()

    def forward(model):
        return rate(lambda: model(idx), work=idx.numel(), iters=5)

    speed = interleaved({"alt": forward(alt), "folded": forward(folded)}, rounds)
    return {"max_abs_diff_fp32": diff32, "max_abs_diff_fp64": diff64,
            "max_abs_logit": ref.abs().max().item(),
            "params_alt": count_params(alt)["total"],
            "params_folded": count_params(folded)["total"],
            "tokens_per_s_alt": speed["alt"], "tokens_per_s_folded": speed["folded"],
            "speed_folded_vs_alt": speed["folded"] / speed["alt"]}
