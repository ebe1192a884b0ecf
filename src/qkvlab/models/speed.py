"""The library's speed measurements of its own modules, for ``qkvlab bench`` and for any
measure that times them.

Each function returns ratios measured side by side in one process (``qkvlab.timing``:
contenders interleaved, median over rounds), since absolute times on a shared machine mean
little. Shapes: B batch, T tokens.
"""

from __future__ import annotations

import copy
import math
import statistics

import torch

from qkvlab.attention import DESIGNS, AttentionConfig, build_attention
from qkvlab.attention.core import attend
from qkvlab.kernels import attend as kattend
from qkvlab.models.config import ModelConfig
from qkvlab.models.fold import fold_alt
from qkvlab.models.lm import DecoderLM
from qkvlab.models.params import count_params
from qkvlab.timing import interleaved, interleaved_rounds, rate, seconds


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


def copy_bandwidth(mbytes: int = 256, reps: int = 5, device: str = "cpu") -> float:
    """Memory bandwidth of ``device`` in bytes/s from the best of ``reps`` copies of a
    ``mbytes`` MB fp32 tensor (bytes read + written / time)."""
    a = torch.empty(mbytes * 2**20 // 4, device=device)
    b = torch.empty_like(a)
    b.copy_(a)  # touch the pages
    best = min(seconds(lambda: b.copy_(a), device=device) for _ in range(reps))
    return 2 * a.nbytes / best


def weight_bytes_per_token(model: DecoderLM) -> int:
    """Bytes of weights one decoding step reads: every parameter once (a tied embedding once,
    as the unembedding), the position table one row."""
    total = sum(p.numel() * p.element_size() for p in model.parameters())
    wpe = model.embed.wpe
    if wpe is not None:
        total -= wpe.weight.nbytes - wpe.weight[0].nbytes
    return total


ROTARY = "rotary_"  # label prefix of the rotary layouts, each read against rotary standard


def kv_variants(n_heads: int, rotary: bool = False) -> dict[str, dict]:
    """The cache layouts the KV-decode measure compares: label -> ModelConfig options. With
    ``rotary``, also rotary standard and rotary tied K=V (whose cache holds the pre-rotary keys,
    rotated as they are read)."""
    out = {"standard": {}, "tied_kv": {"design": "tied_kv"}, "tied_qkv": {"design": "tied_qkv"},
           f"gqa_{n_heads // 2}": {"n_kv_heads": n_heads // 2},
           f"gqa_{n_heads // 4}": {"n_kv_heads": n_heads // 4}, "mqa": {"n_kv_heads": 1}}
    if rotary:
        out |= {ROTARY + "standard": {"positions": "rotary"},
                ROTARY + "tied_kv": {"design": "tied_kv", "positions": "rotary"}}
    return out


def kv_baseline(label: str) -> str:
    """The layout a KV-decode row's ratio is read against: rotary standard for a rotary one."""
    return ROTARY + "standard" if label.startswith(ROTARY) else "standard"


@torch.inference_mode()
def kv_decode_speed(contexts, batches, *, d_model: int = 512, n_heads: int = 8,
                    n_layers: int = 1, d_vocab: int = 65, rounds: int = 3, device: str = "cpu",
                    log=None, rotary: bool = False) -> list[dict]:
    """Tokens/s of one batch decoding step of a decoder whose KV cache holds ``T`` tokens, per
    cache layout (:func:`kv_variants`: standard, tied K=V, Q=K=V, GQA at H/2 and H/4, MQA; same
    d_model, heads, MLP and layers; with ``rotary`` also rotary standard and rotary K=V), for
    every ``T`` in ``contexts`` and B in ``batches``.

    The caches are filled with random values (a prompt of T tokens would take longer than every
    step timed); each timed call is one step as ``generate`` runs it (``DecoderLM.decoding``:
    the kernels measured faster), the cache reset to T tokens each time. Per (T, B) all
    layouts run interleaved, in both orders alike (``rounds`` made even: a contender can run
    faster for its place in a round, ``timing.interleaved_rounds``), each also pinned to SDPA
    (``tokens_per_s_sdpa``; ``own_sdpa``: the geometric mean over rounds of the paired ratio of
    the step on its chosen kernel to the step on SDPA, the choice's gain) and its attention
    alone (``attention_cache_gb_s``: its cache bytes / that time) and a plain read of the same
    cache tensors (``cache_read_gb_s``: the bytes / the time ``torch.sum`` takes over them, the
    rate this machine streams that layout's tensors at, one tensor for K=V and two for
    standard, which a single copy bandwidth does not tell apart). One row per layout and
    (T, B): ``ratio`` (median per-round ratio to ``baseline``: standard, or rotary standard
    for a rotary layout, :func:`kv_baseline`), ``cache_bytes``, ``weight_bytes``,
    ``cache_share`` (cache / both), ``bound_tokens_per_s`` (B · copy bandwidth / bytes a step
    reads), ``copy_gb_s``, ``kernel`` (the decode attention chosen).
    """
    bw = copy_bandwidth(device=device)
    n_ctx = max(contexts) + 1
    models = {}
    for label, opts in kv_variants(n_heads, rotary).items():
        torch.manual_seed(0)
        cfg = ModelConfig(d_vocab=d_vocab, n_ctx=n_ctx, d_model=d_model, n_layers=n_layers,
                          n_heads=n_heads, **opts)
        models[label] = DecoderLM(cfg).eval().to(device)
    rows = []
    for T in contexts:
        for B in batches:
            if log:
                log(f"kv decode: context {T}, batch {B}")
            rows += _kv_point(models, T, B, rounds, bw, device)
    return rows


def _kv_point(models: dict, T: int, B: int, rounds: int, bw: float, device) -> list[dict]:
    """One (context, batch) point of :func:`kv_decode_speed`, every layout interleaved."""
    step = torch.zeros(B, 1, dtype=torch.long, device=device)
    fns, caches, kinds = {}, {}, {}
    for label, model in models.items():
        cs = model.new_caches(B, T + 1)
        for c in cs:
            c.k.uniform_(-1, 1)
            if not c.shared:
                c.v.uniform_(-1, 1)
        caches[label] = cs
        kinds[label] = kattend.decode_attention_kernel(model.blocks[0].attn, B, T + 1,
                                                       rotary=model.rope is not None)

        def run(model=model, cs=cs, kind=None):
            for c in cs:
                c.length = T
            if kind is None:
                with model.decoding(B, T + 1):
                    model(step, caches=cs)
            else:
                with model.decoding(B, T + 1), kattend.use(kind):
                    model(step, caches=cs)

        att = model.blocks[0].attn
        q = torch.randn(B, att.cfg.n_heads, 1, att.cfg.d_head, device=device)
        k, v = cs[0].k.narrow(2, 0, T), cs[0].v.narrow(2, 0, T)

        # a rotary K=V cache holds the pre-rotary keys: the step rotates them (per block on the
        # kernel, the whole cache on SDPA), so its attention alone does too
        rope = (model.rope.cos, model.rope.sin) if model.rope is not None and att.kv_shared \
            else None

        def alone(q=q, k=k, v=v, kind=kinds[label], scale=att.cfg.inner_scale, rope=rope):
            with kattend.use(kind):
                attend(q, k, v, mask=None, is_causal=False, scale=scale, dropout_p=0.0,
                       need_weights=False, key_rope=rope)

        def read(ts=(k,) if cs[0].shared else (k, v)):  # the same bytes, summed
            for t in ts:
                t.sum()

        fns[label] = rate(run, work=B, device=device)
        fns[label + ":sdpa"] = rate(lambda run=run: run(kind="sdpa"), work=B, device=device)
        fns[label + ":attn"] = rate(alone, device=device)
        fns[label + ":read"] = rate(read, device=device)
    raw = interleaved_rounds(fns, rounds + rounds % 2, alternate=True)  # both orders alike
    rows = []
    for label, model in models.items():
        cache = sum(c.k.nbytes // (T + 1) * T * (1 if c.shared else 2) for c in caches[label])
        w = weight_bytes_per_token(model)
        ratios = [a / b for a, b in zip(raw[label], raw[kv_baseline(label)])]
        own = [math.log(a / b) for a, b in zip(raw[label], raw[label + ":sdpa"])]
        layer_cache = cache / len(caches[label])
        rows.append({
            "context": T, "batch": B, "design": label, "n_kv_heads": model.cfg.n_kv_heads,
            "baseline": kv_baseline(label),
            "kernel": kinds[label], "tokens_per_s": statistics.median(raw[label]),
            "tokens_per_s_sdpa": statistics.median(raw[label + ":sdpa"]),
            "own_sdpa": math.exp(statistics.fmean(own)),
            "ratio": statistics.median(ratios), "ratio_min": min(ratios),
            "ratio_max": max(ratios), "cache_bytes": cache, "weight_bytes": w,
            "cache_share": cache / (cache + w), "bound_tokens_per_s": B * bw / (cache + w),
            "attention_cache_gb_s": layer_cache * statistics.median(raw[label + ":attn"]) / 1e9,
            "cache_read_gb_s": layer_cache * statistics.median(raw[label + ":read"]) / 1e9,
            "copy_gb_s": bw / 1e9})
    return rows
