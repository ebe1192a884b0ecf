"""The first steps of a conversion's uptraining, loss by loss, and what the K=V fit did per layer
(a diagnostic of why a converted model's distillation loss rises; prints, stores nothing).

Each step is the one ``qkvlab convert`` takes (``hf.uptrain.Uptrainer``, the same batches of the
stdlib's train split after the calibration tokens); ``--freeze NAME`` keeps every parameter
whose name holds NAME fixed (the optimizer is rebuilt over the rest with Uptrainer's betas and
warmup). ``--fit-stats`` prints, per layer, the largest and smallest singular value of the K=V
fit's map M (V ≈ K·M, folded into W_O) and the largest |k_proj bias|, the two things the values
inherit under K=V.

    python scripts/uptrain-steps.py qwen2.5-coder-0.5b --steps 6 --lr 3e-6 \\
        [--tie kv --start fitted --precision fp32 --freeze o_proj --fit-stats --threads 2]
"""

import argparse
import tempfile
import time

import torch

from qkvlab.hf.convert import ConvertConfig, make_student, token_rows
from qkvlab.hf.cost import load_lm
from qkvlab.hf.tie import calibrate, decoder_layers, fit_kv
from qkvlab.hf.uptrain import UptrainConfig, Uptrainer
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
p.add_argument("--fit-stats", action="store_true")
p.add_argument("--threads", type=int, default=None)
args = p.parse_args()
torch.set_num_threads(args.threads or torch.get_num_threads())
t0 = time.time()
teacher, tok = load_lm(args.model)
teacher.requires_grad_(False).eval()
up = UptrainConfig(lr=args.lr, precision=args.precision)
cfg = ConvertConfig(tie=args.tie, start=args.start, tokens=args.steps * up.tokens_per_step,
                    uptrain=up)
calib = token_rows(tok, "train", cfg.calib_tokens, up.seq_len)
print(f"{args.model} loaded ({time.time() - t0:.0f} s); {args.tie}/{cfg.start}, rate "
      f"{args.lr:g}, {args.precision}, frozen: {args.freeze or 'nothing'}", flush=True)
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
