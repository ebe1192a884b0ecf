"""The first steps of a conversion's uptraining, loss by loss, and what the K=V fit did per layer
(a diagnostic of why a converted model's distillation loss rises; prints, stores nothing).

Each step is the one ``qkvlab convert`` takes (``hf.uptrain.Uptrainer``, the same batches of the
stdlib's train split after the calibration tokens); ``--freeze NAME`` keeps every parameter
whose name holds NAME fixed (the optimizer is rebuilt over the rest with Uptrainer's betas and
warmup). ``--fit-stats`` prints, per layer, the largest and smallest singular value of the K=V
fit's map M (V ≈ K·M, folded into W_O) and the largest |k_proj bias|, the two things the values
inherit under K=V.

``--sensitivity`` trains nothing: it takes one batch's gradient and, for each group of
parameters alone (q_proj, k_proj, v_proj, o_proj, mlp, norms, embeddings, then all of them),
applies Adam's first step (each element moved by the rate, times each of ``--scales``, against
its gradient's sign) and reports the same batch's loss after it, with the size of each layer's
o_proj input in teacher and student (what a step on W_O is multiplied by). A step along the
gradient that raises the loss on the very batch it came from is too long for that group: it
names where a rate that suits the untied model over-steps the tied one.

    python scripts/uptrain-steps.py qwen2.5-coder-0.5b --steps 6 --lr 3e-6 \\
        [--tie kv --start fitted --precision fp32 --freeze o_proj --o-basis untied --fit-stats]
    python scripts/uptrain-steps.py qwen2.5-coder-0.5b --lr 3e-6 --sensitivity \\
        [--scales 1,0.1,0.01 --tie none]
"""

import argparse
import tempfile
import time

import torch

from qkvlab.hf.convert import ConvertConfig, make_student, token_rows
from qkvlab.hf.cost import load_lm
from qkvlab.hf.tie import calibrate, decoder_layers, fit_kv
from qkvlab.hf.uptrain import UptrainConfig, Uptrainer, distill_loss
from qkvlab.train.precision import autocast, resolve_precision

p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
p.add_argument("model")
p.add_argument("--steps", type=int, default=6)
p.add_argument("--lr", type=float, default=1e-4)
p.add_argument("--tie", default="kv")
p.add_argument("--start", default=None)
p.add_argument("--precision", default="bf16", choices=["bf16", "fp32"])
p.add_argument("--freeze", default=None, metavar="NAME",
               help="keep parameters whose name holds NAME fixed (e.g. o_proj)")
p.add_argument("--o-basis", default="tied", choices=["tied", "untied"],
               help="K=V fitted: W_O trained as folded (tied) or as the untied W_O (hf.basis)")
p.add_argument("--fit-stats", action="store_true")
p.add_argument("--sensitivity", action="store_true",
               help="one batch's loss after Adam's first step on each group alone; no training")
p.add_argument("--scales", default="1", type=lambda v: [float(x) for x in v.split(",")],
               help="with --sensitivity: the rate times each of these (e.g. 1,0.1,0.01)")
p.add_argument("--threads", type=int, default=None)
args = p.parse_args()
torch.set_num_threads(args.threads or torch.get_num_threads())
t0 = time.time()
teacher, tok = load_lm(args.model)
teacher.requires_grad_(False).eval()
up = UptrainConfig(lr=args.lr, precision=args.precision, o_basis=args.o_basis)
cfg = ConvertConfig(tie=args.tie, start=args.start, tokens=args.steps * up.tokens_per_step,
                    uptrain=up)
calib = token_rows(tok, "train", cfg.calib_tokens, up.seq_len)
print(f"{args.model} loaded ({time.time() - t0:.0f} s); {args.tie}/{cfg.start}, rate "
      f"{args.lr:g}, {args.precision}, W_O basis {args.o_basis}, frozen: "
      f"{args.freeze or 'nothing'}", flush=True)
if args.fit_stats:
    cal = calibrate(teacher, calib)
    for i, layer in enumerate(decoder_layers(teacher)):
        a = layer.self_attn
        s = torch.linalg.svdvals(fit_kv(a, cal.moments[i]))
        b = a.k_proj.bias
        print(f"layer {i:2d}: M's singular values {s.min():.2e} to {s.max():.2f}; "
              f"max |k bias| {0.0 if b is None else b.abs().max().item():.1f}")
train = token_rows(tok, "train", cfg.tokens, up.seq_len, skip=cfg.calib_tokens)
student = make_student(teacher, cfg, calib)
precision = resolve_precision(up.precision, "cpu")
GROUPS = ("q_proj", "k_proj", "v_proj", "o_proj", "mlp", "norm", "embed", "")


def o_proj_inputs(model, x) -> list[float]:
    """Mean |input| of each layer's o_proj on ``x``: what an Adam step on W_O is multiplied by."""
    seen = []
    hooks = [layer.self_attn.o_proj.register_forward_pre_hook(
        lambda m, a: seen.append(a[0].abs().mean().item())) for layer in decoder_layers(model)]
    with torch.no_grad():
        model(input_ids=x, use_cache=False)
    for h in hooks:
        h.remove()
    return seen


def sensitivity() -> None:
    """Each group's first Adam step alone (lr · scale · sign of the gradient), the same batch
    rescored; and the size of o_proj's input, teacher against student, layer by layer."""
    x = train[:up.batch]
    t_in, s_in = o_proj_inputs(teacher, x), o_proj_inputs(student, x)
    print("o_proj input, mean |h| per layer, teacher -> student: " + ", ".join(
        f"{i}: {a:.3g}->{b:.3g}" for i, (a, b) in enumerate(zip(t_in, s_in))), flush=True)
    params = dict(student.named_parameters())  # a tied Parameter once, under its first name
    for q in params.values():
        q.requires_grad_(True)
    loss = distill_loss(student, teacher, x, up, lambda: autocast(precision, "cpu"))
    loss.backward()
    base = loss.item()
    print(f"one batch of {up.batch} x {up.seq_len}: loss {base:.4f}; after the first Adam step "
          f"at {args.lr:g} x scale on one group alone:", flush=True)
    for g in GROUPS:
        names = [n for n in params if g in n]
        if not names:
            continue
        saved = {n: params[n].detach().clone() for n in names}
        got = []
        for scale in args.scales:
            with torch.no_grad():
                for n in names:
                    params[n].sub_(args.lr * scale * params[n].grad.sign())
                after = distill_loss(student, teacher, x, up,
                                     lambda: autocast(precision, "cpu")).item()
                for n in names:
                    params[n].copy_(saved[n])
            got.append(f"x{scale:g}: {after:.4f} ({after - base:+.4f})")
        n_el = sum(params[n].numel() for n in names)
        print(f"  {g or 'all':7s} ({len(names):3d} tensors, {n_el / 1e6:7.2f}M): "
              + "; ".join(got), flush=True)
    if args.tie == "kv" and cfg.start == "fitted" and args.o_basis == "tied":
        untied_basis_step(base, x)


def untied_basis_step(base: float, x: torch.Tensor) -> None:
    """o_proj's first Adam step taken on the untied W_O of W_O' = W_O·Mᵀ (M the fit's map,
    fixed): sign(∂L/∂W_O) = sign(∂L/∂W_O'·M), then mapped back through Mᵀ."""
    cal = calibrate(teacher, calib)
    layers = list(zip(decoder_layers(teacher), decoder_layers(student)))
    saved = [s.self_attn.o_proj.weight.detach().clone() for _, s in layers]
    got = []
    for scale in args.scales:
        with torch.no_grad():
            for i, (t, s) in enumerate(layers):
                w = s.self_attn.o_proj.weight
                n_heads = t.self_attn.config.num_attention_heads
                M = fit_kv(t.self_attn, cal.moments[i]).to(w)
                M_h = M.repeat_interleave(n_heads // M.shape[0], 0)
                g = torch.einsum("dhf,hfe->dhe", w.grad.view(w.shape[0], n_heads, -1), M_h)
                w.sub_(torch.einsum("dhe,hfe->dhf", args.lr * scale * g.sign(), M_h)
                       .reshape(w.shape))
            after = distill_loss(student, teacher, x, up,
                                 lambda: autocast(precision, "cpu")).item()
            for (_, s), w0 in zip(layers, saved):
                s.self_attn.o_proj.weight.copy_(w0)
        got.append(f"x{scale:g}: {after:.4f} ({after - base:+.4f})")
    print("  o_proj, the step on the untied W_O (W_O' = W_O·Mᵀ): " + "; ".join(got), flush=True)


if args.sensitivity:
    sensitivity()
    raise SystemExit(0)
with tempfile.TemporaryDirectory() as tmp:
    tr = Uptrainer(student, teacher, train, up, tmp, lambda: autocast(precision, "cpu"))
    if args.freeze:
        frozen = {id(q) for n, q in student.named_parameters() if args.freeze in n}
        for q in tr.params:
            q.requires_grad_(id(q) not in frozen)
        tr.params = [q for q in tr.params if id(q) not in frozen]
        tr.opt = torch.optim.AdamW(tr.params, lr=up.lr, betas=(0.9, 0.95), weight_decay=0.0)
        tr.sched = torch.optim.lr_scheduler.LambdaLR(
            tr.opt, lambda s: min(1.0, (s + 1) / (up.warmup + 1)))
    tr.run_to(args.steps)  # one call: a checkpoint at its end only
for step, loss in enumerate(tr.state["losses"], 1):
    print(f"step {step}: distillation loss {loss:.4f}")
