"""Side-by-side speed benchmarks, reported as ratios measured in one run.

Absolute times on a shared machine mean little; every figure here is a ratio against a peer
(HF ``GPT2LMHeadModel`` with SDPA, ``x-transformers``) or against ``standard`` attention,
measured interleaved (round-robin over the contenders, median over rounds) so that machine
noise hits all contenders alike.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from qkvlab.attention import DESIGNS, AttentionConfig, build_attention
from qkvlab.models import DecoderLM, ModelConfig, count_params, fold_alt, from_hf_gpt2

VOCAB = 65  # character-level, as nanoGPT's Shakespeare benchmark


@dataclass(frozen=True)
class Size:
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


def interleaved(fns: dict[str, Callable[[], float]], rounds: int) -> dict[str, float]:
    """Median over ``rounds`` of each fn's returned rate, contenders run round-robin after
    one warm-up call each, so machine noise hits all contenders alike."""
    for fn in fns.values():
        fn()
    rates: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(rounds):
        for k, fn in fns.items():
            rates[k].append(fn())
    return {k: statistics.median(v) for k, v in rates.items()}


# ---- training throughput -------------------------------------------------------------------
def _ours(s: Size):
    return DecoderLM(ModelConfig(d_vocab=VOCAB, n_ctx=s.n_ctx, d_model=s.d_model,
                                 n_layers=s.n_layers, n_heads=s.n_heads))


def _hf_gpt2(s: Size):
    import transformers  # lazy here and below: optional extra [bench]; peers are optional

    cfg = transformers.GPT2Config(vocab_size=VOCAB, n_positions=s.n_ctx, n_embd=s.d_model,
                                  n_layer=s.n_layers, n_head=s.n_heads, resid_pdrop=0.0,
                                  embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0,
                                  attn_implementation="sdpa")
    model = transformers.GPT2LMHeadModel(cfg)
    assert model.config._attn_implementation == "sdpa", model.config._attn_implementation
    return lambda idx, m=model: m(idx).logits, model


def _x_transformers(s: Size):
    from x_transformers import Decoder, TransformerWrapper  # lazy: optional extra [bench]

    model = TransformerWrapper(num_tokens=VOCAB, max_seq_len=s.n_ctx,
                               attn_layers=Decoder(dim=s.d_model, depth=s.n_layers,
                                                   heads=s.n_heads, attn_flash=True))
    return model, model


PEERS = {"hf_gpt2": _hf_gpt2, "x_transformers": _x_transformers}


def _train_rate(forward, model, s: Size, steps: int, bf16: bool, seed: int = 0):
    """A closure timing ``steps`` AdamW steps; returns tokens/s. Also records the losses.

    ``bf16`` trains in bf16 autocast unconditionally, as the trainer's
    ``precision="bf16_force"`` does: the benchmark measures bf16 on purpose, also on a CPU
    where ``precision="bf16"`` would fall back to fp32 (``qkvlab bench`` prints that CPU's
    native bf16 and measured bf16 cost first)."""
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    data = bigram_batches(s, 64, seed)
    losses: list[float] = []

    def step():
        idx = data[len(losses) % len(data)]  # a fresh batch each step, same order for everyone
        ctx = torch.autocast("cpu", dtype=torch.bfloat16) if bf16 else contextlib.nullcontext()
        with ctx:
            logits = forward(idx[:, :-1])
        loss = F.cross_entropy(logits.float().flatten(0, 1), idx[:, 1:].flatten())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(loss.item())

    def run() -> float:
        t = time.perf_counter()
        for _ in range(steps):
            step()
        return steps * s.batch * s.n_ctx / (time.perf_counter() - t)

    return run, losses


def bench_training(size: str = "small", steps: int = 5, rounds: int = 3, peers=("hf_gpt2", "x_transformers"),
                   bf16: bool = True, log=print) -> dict[str, float]:
    """Training tokens/s of qkvlab's DecoderLM (fp32, bf16 autocast) and the peers (fp32)."""
    s = SIZES[size]
    torch.manual_seed(0)
    fns, losses = {}, {}
    ours, ours16 = _ours(s), _ours(s)
    ours16.load_state_dict(ours.state_dict())  # same init: the loss curves must coincide
    fns["qkvlab"], losses["qkvlab"] = _train_rate(ours, ours, s, steps, bf16=False)
    if bf16:
        fns["qkvlab_bf16"], losses["qkvlab_bf16"] = _train_rate(ours16, ours16, s, steps, bf16=True)
    for p in peers:
        forward, model = PEERS[p](s)
        fns[p], losses[p] = _train_rate(forward, model, s, steps, bf16=False)
    log(f"training throughput, size {size}: {s}")
    rates = interleaved(fns, rounds)
    # Same data, same init: fp32 and bf16 losses of our model should track each other.
    if bf16:
        n = min(len(losses["qkvlab"]), len(losses["qkvlab_bf16"]))
        rates["bf16_loss_gap"] = max(abs(a - b) for a, b in zip(losses["qkvlab"][:n], losses["qkvlab_bf16"][:n]))
    return rates


# ---- attention module forward + backward -------------------------------------------------
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
                          rounds: int = 5) -> dict[str, dict[str, float]]:
    """Forward+backward time of one causal self-attention layer per variant (label ->
    AttentionConfig options; default: every design), relative to ``standard``, beside its
    FLOPs and parameter ratios."""
    variants = variants or {d: {"design": d} for d in DESIGNS}
    x = torch.randn(B, T, d_model, requires_grad=True)
    fns, flops, params = {}, {}, {}
    for label, opts in {"standard": {}, **variants}.items():
        cfg = AttentionConfig(d_model=d_model, n_heads=n_heads, **opts)
        att = build_attention(cfg)
        flops[label] = projection_flops(cfg, B, T)
        params[label] = sum(p.numel() for p in att.parameters())

        def run(att=att) -> float:
            t = time.perf_counter()
            for _ in range(iters):
                att(x, is_causal=True).sum().backward()
            return iters / (time.perf_counter() - t)

        fns[label] = run
    rates = interleaved(fns, rounds)
    return {k: {"time_vs_standard": rates["standard"] / rates[k],
                "flops_vs_standard": flops[k] / flops["standard"],
                "params": params[k], "params_vs_standard": params[k] / params["standard"]}
            for k in fns}


def bench_attention(size: str = "large", iters: int = 5, rounds: int = 5, log=print) -> dict[str, dict]:
    """Forward+backward time of each design's layer relative to ``standard`` (causal, fp32)."""
    s = SIZES[size]
    log(f"attention layer fwd+bwd, size {size}")
    return attention_layer_speed(s.d_model, s.n_heads, s.n_ctx, s.batch, iters=iters, rounds=rounds)


# ---- decoding --------------------------------------------------------------------------------
def bench_decode(size: str = "large", new_tokens: int = 128, rounds: int = 3, log=print) -> dict[str, float]:
    """Batch-1 greedy decode tokens/s: qkvlab's KV cache vs HF ``generate()`` (same weights)."""
    import transformers  # lazy: optional extra [bench]

    s = SIZES[size]
    _, hf = _hf_gpt2(s)
    hf.eval()
    ours = from_hf_gpt2(hf).eval()
    prompt = torch.randint(0, VOCAB, (1, 8), generator=torch.Generator().manual_seed(0))
    new = min(new_tokens, s.n_ctx - prompt.shape[1])
    transformers.logging.set_verbosity_error()

    def run_ours() -> float:
        t = time.perf_counter()
        ours.generate(prompt, new, greedy=True)
        return new / (time.perf_counter() - t)

    def run_hf() -> float:
        t = time.perf_counter()
        with torch.no_grad():
            hf.generate(prompt, max_new_tokens=new, min_new_tokens=new, do_sample=False, pad_token_id=0)
        return new / (time.perf_counter() - t)

    # Same weights, same function: compare logits on a generated sequence (argmax ties of an
    # untrained model can flip on float rounding, so token equality is tested in float64 in
    # the test suite instead).
    seq = ours.generate(prompt, new, greedy=True)
    with torch.no_grad():
        gap = (ours(seq) - hf(seq).logits).abs().max().item()
    log(f"decode, size {size}, batch 1, {new} new tokens (max |logit diff| vs HF: {gap:.2g})")
    rates = interleaved({"qkvlab": run_ours, "hf_generate": run_hf}, rounds)
    rates["max_logit_diff"] = gap
    return rates


def cache_bytes_table(size: str = "large") -> dict[str, int]:
    """KV-cache bytes per token (all layers, fp32) per design, plus GQA/MQA references."""
    s = SIZES[size]
    out = {}
    variants = [(d, None) for d in DESIGNS] + [("standard", s.n_heads // 2), ("standard", 1)]
    for d, g in variants:
        cfg = ModelConfig(d_vocab=VOCAB, n_ctx=s.n_ctx, d_model=s.d_model, n_layers=s.n_layers,
                          n_heads=s.n_heads, design=d, n_kv_heads=g)
        with torch.device("meta"):
            model = DecoderLM(cfg)
        name = d if g is None else f"standard GQA G={g}"
        out[name] = sum(c.nbytes for c in model.new_caches(1, 1))
    return out


# ---- fold_alt: the 4th matrix adds cost, not expressivity -----------------------------------
def bench_fold_alt(size: str = "small", train_steps: int = 200, rounds: int = 5, seed: int = 0,
                   log=print) -> dict[str, float]:
    """Train an ``alt`` DecoderLM briefly, fold it into ``standard``, and compare.

    The training data is a fixed random bigram language (so the model learns something real
    and the weights are no longer at init). Reports the max |logit difference| after folding
    in fp32 and fp64, both parameter counts, and the forward speed ratio folded / alt.
    """
    s = SIZES[size]
    data = bigram_batches(s, train_steps + 1, seed)
    torch.manual_seed(seed)
    alt = DecoderLM(ModelConfig(d_vocab=VOCAB, n_ctx=s.n_ctx, d_model=s.d_model,
                                n_layers=s.n_layers, n_heads=s.n_heads, design="alt"))
    opt = torch.optim.AdamW(alt.parameters(), lr=3e-3)
    first = last = None
    for idx in data[:-1]:
        loss = F.cross_entropy(alt(idx[:, :-1]).flatten(0, 1), idx[:, 1:].flatten())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        first = loss.item() if first is None else first
        last = loss.item()
    alt.eval()
    log(f"fold_alt, size {size}: trained {train_steps} steps, loss {first:.3f} -> {last:.3f}")
    return {"train_loss_first": first, "train_loss_last": last,
            **fold_compare(alt, data[-1][:, :-1], rounds)}


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

    def rate(model):
        def run() -> float:
            t = time.perf_counter()
            for _ in range(5):
                model(idx)
            return 5 * idx.numel() / (time.perf_counter() - t)
        return run

    speed = interleaved({"alt": rate(alt), "folded": rate(folded)}, rounds)
    return {"max_abs_diff_fp32": diff32, "max_abs_diff_fp64": diff64,
            "max_abs_logit": ref.abs().max().item(),
            "params_alt": count_params(alt)["total"], "params_folded": count_params(folded)["total"],
            "tokens_per_s_alt": speed["alt"], "tokens_per_s_folded": speed["folded"],
            "speed_folded_vs_alt": speed["folded"] / speed["alt"]}
