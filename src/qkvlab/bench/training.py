"""Training throughput of qkvlab's decoder against each peer, qkvlab matched to the peer's
settings, all contenders interleaved in one measurement."""

from __future__ import annotations

import contextlib
import functools
import statistics

import torch

from qkvlab.bench.peers import MATCHED, builders
from qkvlab.bench.workload import SIZES, VOCAB, Size, lm_loss, qkvlab_lm, train_batches
from qkvlab.timing import interleaved_rounds, rate, ratio_stats, seconds


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
    qkvlab under each peer's settings (``qkvlab.bench.peers.MATCHED``). ``nanogpt`` is the path
    of a nanoGPT checkout (both its ``bias`` settings are run).

    Returns tokens/s per contender, and ``vs_peer``: for each peer its matched qkvlab name and
    the qkvlab / peer ratio (median, min, max over rounds; > 1: qkvlab is faster).
    With ``compile``: ``compile_s`` (first compiled step minus an eager one; inductor caches
    compiled graphs on disk, so a repeated run measures a warm cache) and ``compiled``
    (compiled / eager qkvlab ratio).
    """
    s = SIZES[size]
    build = builders(peers, nanogpt)
    torch.manual_seed(0)
    fns, losses, out = {}, {}, {}
    ours = qkvlab_lm(s)
    timed = functools.partial(_train_rate, s=s, steps=steps, device=device)
    fns["qkvlab"], losses["qkvlab"] = timed(lm_loss(ours), ours, bf16=False)
    if bf16:
        ours16 = qkvlab_lm(s)
        ours16.load_state_dict(ours.state_dict())  # same init: the loss curves must coincide
        fns["qkvlab_bf16"], losses["qkvlab_bf16"] = timed(lm_loss(ours16), ours16, bf16=True)
    if compile:
        comp = qkvlab_lm(s)
        comp.load_state_dict(ours.state_dict())
        compiled = torch.compile(comp)
        run, _ = _train_rate(lm_loss(compiled), comp, s, 1, bf16=False, device=device)
        first = seconds(run, device=device)  # the first step compiles
        fns["qkvlab_compiled"], _ = timed(lm_loss(compiled), comp, bf16=False)
        eager = s.batch * s.n_ctx / fns["qkvlab"]()
        out["compile_s"] = first - eager
    matched = {}
    for p, builder in build.items():
        with torch.device(device):  # a peer's tensors that are not parameters or buffers too
            loss_fn, model = builder(s, VOCAB)
        fns[p], losses[p] = timed(loss_fn, model, bf16=False)
        name = "qkvlab" if MATCHED[p] == _DEFAULT else _matched_name(MATCHED[p])
        matched[p] = name
        if name not in fns:
            m = qkvlab_lm(s, **MATCHED[p])
            fns[name], _ = timed(lm_loss(m), m, bf16=False)
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
        out["bf16_loss_gap"] = max(abs(a - b)
                                   for a, b in zip(losses["qkvlab"][:n], losses["qkvlab_bf16"][:n]))
    return out


_DEFAULT = {"bias": True, "activation": "gelu_tanh"}  # ModelConfig's defaults of these options
