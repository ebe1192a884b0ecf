"""Side-by-side speed benchmarks, reported as ratios measured in one run.

Absolute times on a shared machine mean little; every figure here is a ratio against a peer
(``qkvlab.peers``: HF GPT-2, x-transformers, litgpt, nanoGPT) or against ``standard`` attention,
measured interleaved (round-robin over the contenders, median over rounds) so that machine
noise hits all contenders alike.
"""

from __future__ import annotations

import contextlib
import functools
import statistics
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from qkvlab.attention import DESIGNS
from qkvlab.kernels import gemv, linear
from qkvlab.models import DecoderLM, ModelConfig, from_hf_gpt2
from qkvlab.models.speed import attention_layer_speed, fold_compare
from qkvlab.timing import interleaved_rounds, rate, ratio_stats, seconds

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


def default_device() -> str:
    """``cuda`` where PyTorch sees a GPU, else ``cpu`` (as the trainer picks)."""
    return "cuda" if torch.cuda.is_available() else "cpu"


def check_device(device: str) -> str:
    """``device`` as a torch device string the bench can run on (``cpu`` or an existing CUDA
    device); a ValueError naming what is wrong otherwise."""
    try:
        d = torch.device(device)
    except RuntimeError as e:
        raise ValueError(f"device: {device!r} is not a torch device ({e})") from None
    if d.type not in ("cpu", "cuda"):
        raise ValueError(f"device: {device!r}: the bench runs on cpu or cuda")
    if d.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"device: {device!r}: no CUDA device here "
                             "(torch.cuda.is_available() is False)")
        if d.index is not None and d.index >= torch.cuda.device_count():
            raise ValueError(f"device: {device!r}: only {torch.cuda.device_count()} CUDA "
                             "device(s) here")
    return str(d)


# ---- training throughput -------------------------------------------------------------------
def _ours(s: Size, **opts):
    return DecoderLM(ModelConfig(d_vocab=VOCAB, n_ctx=s.n_ctx, d_model=s.d_model,
                                 n_layers=s.n_layers, n_heads=s.n_heads, **opts))


def _ours_loss(model):
    return lambda x, y: F.cross_entropy(model(x).flatten(0, 1), y.flatten())


def train_batches(s: Size, n: int, seed: int = 0) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """``n`` (inputs, targets) pairs, each (B, n_ctx) and contiguous, as a data loader gives."""
    return [(b[:, :-1].contiguous(), b[:, 1:].contiguous()) for b in bigram_batches(s, n, seed)]


def _train_rate(loss_fn, model, s: Size, steps: int, bf16: bool, seed: int = 0,
                device: str = "cpu"):
    """A closure timing ``steps`` AdamW steps of ``loss_fn(x, y)`` on ``device`` (the model is
    moved there); returns tokens/s. Also records the losses.

    ``bf16`` trains in bf16 autocast unconditionally, as the trainer's
    ``precision="bf16_force"`` does: the benchmark measures bf16 on purpose, also on a CPU
    where ``precision="bf16"`` would fall back to fp32 (``qkvlab bench`` prints that CPU's
    native bf16 and measured bf16 cost first)."""
    model.to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    data = [(x.to(device), y.to(device)) for x, y in train_batches(s, 64, seed)]
    kind = torch.device(device).type
    losses: list[float] = []

    def step():
        x, y = data[len(losses) % len(data)]  # a fresh batch each step, same order for everyone
        ctx = torch.autocast(kind, dtype=torch.bfloat16) if bf16 else contextlib.nullcontext()
        with ctx:
            loss = loss_fn(x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(loss.item())

    return rate(step, work=s.batch * s.n_ctx, iters=steps, device=device), losses


def _matched_name(opts: dict) -> str:
    return "qkvlab[" + ",".join(f"{k}={v}" for k, v in sorted(opts.items())) + "]"


def bench_training(size: str = "small", steps: int = 5, rounds: int = 3,
                   peers=("hf_gpt2", "x_transformers", "litgpt"), nanogpt: str | None = None,
                   bf16: bool = True, compile: bool = False, device: str = "cpu",
                   log=print) -> dict:
    """Training tokens/s of qkvlab's DecoderLM and of each peer, with qkvlab matched to it, on
    ``device`` (bf16 autocast of that device type).

    Every contender runs in one interleaved measurement: qkvlab's default (``qkvlab``; also in
    bf16 autocast with ``bf16``, and under ``torch.compile`` with ``compile``), each peer, and
    qkvlab under each peer's settings (``qkvlab.peers.MATCHED``). ``nanogpt`` is the path of a
    nanoGPT checkout (both its ``bias`` settings are run).

    Returns tokens/s per contender, and ``vs_peer``: for each peer its matched qkvlab name and
    the qkvlab / peer ratio (median, min, max over rounds; > 1: qkvlab is faster).
    With ``compile``: ``compile_s`` (first compiled step minus an eager one; inductor caches
    compiled graphs on disk, so a repeated run measures a warm cache) and ``compiled``
    (compiled / eager qkvlab ratio).
    """
    from qkvlab import peers as P

    s = SIZES[size]
    build = P.builders(peers, nanogpt)
    torch.manual_seed(0)
    fns, losses, out = {}, {}, {}
    ours = _ours(s)
    timed = functools.partial(_train_rate, s=s, steps=steps, device=device)
    fns["qkvlab"], losses["qkvlab"] = timed(_ours_loss(ours), ours, bf16=False)
    if bf16:
        ours16 = _ours(s)
        ours16.load_state_dict(ours.state_dict())  # same init: the loss curves must coincide
        fns["qkvlab_bf16"], losses["qkvlab_bf16"] = timed(_ours_loss(ours16), ours16, bf16=True)
    if compile:
        comp = _ours(s)
        comp.load_state_dict(ours.state_dict())
        compiled = torch.compile(comp)
        run, _ = _train_rate(_ours_loss(compiled), comp, s, 1, bf16=False, device=device)
        first = seconds(run, device=device)  # the first step compiles
        fns["qkvlab_compiled"], _ = timed(_ours_loss(compiled), comp, bf16=False)
        eager = s.batch * s.n_ctx / fns["qkvlab"]()
        out["compile_s"] = first - eager
    matched = {}
    for p, builder in build.items():
        with torch.device(device):  # a peer's tensors that are not parameters or buffers too
            loss_fn, model = builder(s, VOCAB)
        fns[p], losses[p] = timed(loss_fn, model, bf16=False)
        name = "qkvlab" if P.MATCHED[p] == _DEFAULT else _matched_name(P.MATCHED[p])
        matched[p] = name
        if name not in fns:
            m = _ours(s, **P.MATCHED[p])
            fns[name], _ = timed(_ours_loss(m), m, bf16=False)
    log(f"training throughput, size {size}, {device}: {s}, contenders {list(fns)}")
    raw = interleaved_rounds(fns, rounds)
    out.update({k: statistics.median(v) for k, v in raw.items()})
    out["rounds"] = rounds
    out["vs_peer"] = {p: {"qkvlab": name, **ratio_stats(raw[name], raw[p])}
                      for p, name in matched.items()}
    if compile:
        out["compiled"] = ratio_stats(raw["qkvlab_compiled"], raw["qkvlab"])
    # Same data, same init: fp32 and bf16 losses of our model should track each other.
    if bf16:
        n = min(len(losses["qkvlab"]), len(losses["qkvlab_bf16"]))
        out["bf16_loss_gap"] = max(abs(a - b) for a, b in zip(losses["qkvlab"][:n], losses["qkvlab_bf16"][:n]))
    return out


_DEFAULT = {"bias": True, "activation": "gelu_tanh"}  # ModelConfig's defaults of these options


# ---- attention module forward + backward -------------------------------------------------
def bench_attention(size: str = "large", iters: int = 5, rounds: int = 5, device: str = "cpu",
                    log=print) -> dict[str, dict]:
    """Forward+backward time of each design's layer relative to ``standard`` (causal, fp32)."""
    s = SIZES[size]
    log(f"attention layer fwd+bwd, size {size}, {device}")
    return attention_layer_speed(s.d_model, s.n_heads, s.n_ctx, s.batch, iters=iters,
                                 rounds=rounds, device=device)


# ---- decoding --------------------------------------------------------------------------------
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


def decode_matrices(model: DecoderLM) -> list[tuple[torch.Tensor, torch.Tensor | None]]:
    """(weight, bias) of every projection a decoding step multiplies a vector by: each
    attention's fused W_in, every ``nn.Linear`` (the unembedding, tied or not, once)."""
    return gemv.matrices(model)


@torch.no_grad()
def gemv_seconds_per_token(model: DecoderLM, reps: int = 9, fn: Callable = F.linear) -> float:
    """Seconds the matrix-vector products of one batch-1 decoding step take on their own: every
    projection (each attention's fused W_in, every ``nn.Linear``, the unembedding once) applied
    to one vector with its bias by ``fn`` (``F.linear``, the kernel HF runs; or qkvlab's
    :func:`qkvlab.kernels.linear`, the one its decoding runs), median of ``reps``. Where the
    weights fit in the CPU's cache this, not the copy bandwidth, is the floor the rest of the
    step adds to."""
    mats = decode_matrices(model)
    xs = [torch.randn(1, w.shape[1], dtype=w.dtype, device=w.device) for w, _ in mats]

    def once() -> None:
        for (w, b), x in zip(mats, xs):
            fn(x, w, b)

    device = mats[0][0].device
    with gemv.use(gemv.decode_kernel(model)):  # what linear runs inside generate
        seconds(once, device=device)  # warm-up
        return statistics.median(seconds(once, device=device) for _ in range(reps))


def bench_decode(size: str = "large", new_tokens: int = 128, rounds: int = 3,
                 device: str = "cpu", log=print) -> dict[str, float]:
    """Batch-1 greedy decode tokens/s on ``device``: qkvlab's KV cache vs HF ``generate()``
    (same weights),
    the ratio (median, min, max over rounds), and two bounds: measured copy bandwidth / weight
    bytes read per token, and the step's matrix-vector products alone
    (:func:`gemv_seconds_per_token`), the tighter one where the weights fit in cache: with
    ``F.linear`` (HF's kernel) and with the kernel qkvlab's decoding chose for the model
    (``gemv_kernel``: batched or linear; ``gemv_probe``: the ratio measured again)."""
    import transformers  # lazy: optional extra [bench]

    s = SIZES[size]
    from qkvlab.peers import hf_gpt2

    _, hf = hf_gpt2(s, VOCAB)
    hf.eval()
    ours = from_hf_gpt2(hf).eval().to(device)
    hf.to(device)
    prompt = torch.randint(0, VOCAB, (1, 8), generator=torch.Generator().manual_seed(0))
    prompt = prompt.to(device)
    new = min(new_tokens, s.n_ctx - prompt.shape[1])
    transformers.logging.set_verbosity_error()

    def hf_generate() -> None:
        with torch.no_grad():
            hf.generate(prompt, max_new_tokens=new, min_new_tokens=new, do_sample=False, pad_token_id=0)

    # Same weights, same function: compare logits on a generated sequence (argmax ties of an
    # untrained model can flip on float rounding, so token equality is tested in float64 in
    # the test suite instead).
    seq = ours.generate(prompt, new, greedy=True)
    with torch.no_grad():
        gap = (ours(seq) - hf(seq).logits).abs().max().item()
    log(f"decode, size {size}, batch 1, {device}, {new} new tokens "
        f"(max |logit diff| vs HF: {gap:.2g})")
    raw = interleaved_rounds({"qkvlab": rate(lambda: ours.generate(prompt, new, greedy=True),
                                             work=new, device=device),
                              "hf_generate": rate(hf_generate, work=new, device=device)}, rounds)
    rates = {k: statistics.median(v) for k, v in raw.items()}
    rates.update(ratio_stats(raw["qkvlab"], raw["hf_generate"]), max_logit_diff=gap,
                 threads=torch.get_num_threads())
    bw = copy_bandwidth(device=device)
    rates.update(bandwidth_gb_s=bw / 1e9, weight_mb_per_token=weight_bytes_per_token(ours) / 1e6,
                 bound_tokens_per_s=bw / weight_bytes_per_token(ours),
                 gemv_tokens_per_s=1 / gemv_seconds_per_token(ours),
                 gemv_ours_tokens_per_s=1 / gemv_seconds_per_token(ours, fn=linear),
                 gemv_kernel=gemv.decode_kernel(ours),
                 gemv_probe=gemv.gemv_probe(gemv.matrices(ours)))
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
