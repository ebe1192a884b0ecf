"""``qkvlab convert SOURCE --tie kv --start fitted --tokens N``: tie a trained decoder, uptrain it
by distillation, and print the gap to the teacher at each budget (see :mod:`qkvlab.hf.convert`)."""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

from qkvlab.hf.tie import STARTS
from qkvlab.hf.uptrain import UptrainConfig
from qkvlab.tables import markdown_table


def _positive(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        v = 0
    if v < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive integer")
    return v


def _rate(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        v = math.nan
    if not (v > 0 and math.isfinite(v)):
        raise argparse.ArgumentTypeError(f"{text!r} is not a finite positive rate")
    return v


def _rates(text: str) -> tuple[float, ...]:
    return tuple(_rate(x) for x in text.split(","))


def _bases(text: str) -> tuple[str, ...]:
    from qkvlab.hf.basis import O_BASES
    bases = tuple(dict.fromkeys(x.strip() for x in text.split(",")))
    if not bases or any(b not in O_BASES for b in bases):
        raise argparse.ArgumentTypeError(f"{text!r}: name one or more of {', '.join(O_BASES)}")
    return bases



def configure_convert(parser: argparse.ArgumentParser) -> None:
    starts = sorted({s for v in STARTS.values() for s in v})
    d, u = 262144, UptrainConfig()
    parser.add_argument("source", metavar="SOURCE",
                        help="zoo name (smollm2), a .gguf file or an HF model folder")
    parser.add_argument("--tie", default="kv",
                        help="kv | qk | qkv | gqa:N | mqa | none (none: the untied model "
                             "uptrained the same way, the baseline) (default kv)")
    parser.add_argument("--start", choices=starts, default=None,
                        help="how the shared projection starts: fitted (least squares on real "
                             "activations; default, for gqa/mqa the values fitted and the keys "
                             "mean-pooled), avg, keep_k, keep_v (K=V only), mean_pool (gqa/mqa; "
                             "their default)")
    parser.add_argument("--tokens", type=_positive, default=d,
                        help=f"uptraining tokens (default {d}); scored at 0, 16k, 64k, ... "
                             "and there")
    parser.add_argument("--lr", type=_rate, default=u.lr,
                        help=f"AdamW rate (default {u.lr:g}, fixed, not chosen on validation "
                             "text: --lr-grid chooses it, and the rate a tie tolerates depends "
                             "on the model; docs/convert.md)")
    parser.add_argument("--lr-grid", type=_rates, default=None, metavar="X,Y,...",
                        help="choose the rate among these on the stdlib's val files (each "
                             "uptrains a fresh student for 16,384 tokens), then run at it; "
                             "e.g. 3e-5,1e-4,3e-4")
    parser.add_argument("--lr-tokens", type=_positive, default=None, metavar="N",
                        help="with --lr-grid: uptrain each candidate this many tokens before "
                             "scoring it (default 16,384, the first budget, which favours small "
                             "rates; a later budget chooses where the curve has settled)")
    parser.add_argument("--batch", type=_positive, default=u.batch)
    parser.add_argument("--seq-len", type=_positive, default=u.seq_len)
    parser.add_argument("--train", choices=("all", "attention"), default=u.train,
                        help="which parameters uptrain (default all)")
    parser.add_argument("--precision", choices=("bf16", "fp32"), default=u.precision,
                        help="bf16 autocast where the device has it natively (default), else fp32")
    parser.add_argument("--head", choices=("fp32", "bf16"), default=u.head,
                        help="the output layer's matmuls while training (default fp32; bf16 "
                             "runs them at the body's rate, its logits in fp32; scoring is fp32)")
    parser.add_argument("--o-basis", type=_bases, default=(u.o_basis,), metavar="BASIS",
                        help="K=V from the fitted start: train W_O' = W_O·Mᵀ as itself (tied, "
                             "default) or as the untied W_O with the fit's M fixed (untied: "
                             "Adam's steps sized as for the untied model; hf.basis); with "
                             "--lr-grid, 'tied,untied' chooses the basis with the rate on val")
    parser.add_argument("--eval-tokens", type=_positive, default=32768,
                        help="held-out test tokens scored at each budget (default 32768)")
    parser.add_argument("--more-text", default=None, metavar="DIR",
                        help="more Python source for training, read after the stdlib's train "
                             "split (every *.py under DIR, test folders left out; a GPU "
                             "outruns the stdlib's ~2.8M tokens)")
    parser.add_argument("--time-limit", type=_positive, default=None, metavar="SECONDS",
                        help="stop uptraining after this long, checkpointed, and store the "
                             "budgets reached as the run that ends at the last of them")
    parser.add_argument("--out", default=None, help="write the uptrained model to this folder")
    parser.add_argument("--db", default="results/qkvlab.db", help="results store (SQLite)")
    parser.add_argument("--device", default="cpu", help="torch device (default cpu)")
    parser.add_argument("--threads", type=_positive, default=None,
                        help="torch threads (default: torch's)")


def run_convert(args) -> int:
    import torch

    from qkvlab.experiments.store import Store
    from qkvlab.hf.convert import ConvertConfig, convert
    from qkvlab.hf.convert import gap_text as _gap
    from qkvlab.hf.cost import lm_path

    cfg = ConvertConfig(tie=args.tie, start=args.start, tokens=args.tokens,
                        eval_tokens=args.eval_tokens,
                        uptrain=UptrainConfig(lr=args.lr, batch=args.batch, seq_len=args.seq_len,
                                              train=args.train, precision=args.precision,
                                              head=args.head, o_basis=args.o_basis[0]))
    if args.device != "cpu" and not args.device.startswith("cuda"):
        raise ValueError(f"--device: {args.device!r} is not 'cpu' or 'cuda[:N]'")
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"--device: {args.device} asked for, but no CUDA device is available")
    if args.lr_tokens is not None and not args.lr_grid:
        raise ValueError("--lr-tokens: the budget a rate is chosen at, so it needs --lr-grid")
    if len(args.o_basis) > 1 and not args.lr_grid:
        raise ValueError("--o-basis: a list is a choice made on val with the rate, so it needs "
                         "--lr-grid")
    if args.more_text is not None and not Path(args.more_text).is_dir():
        raise ValueError(f"--more-text: {args.more_text} is not a folder")
    if args.threads:
        torch.set_num_threads(args.threads)
    lm_path(args.source)  # a name or path that names nothing: refused before the store opens
    Path(args.db).parent.mkdir(parents=True, exist_ok=True)
    with Store(args.db) as store:
        recs = convert(store, args.source, cfg, device=args.device, out=args.out,
                       more_text=args.more_text, time_limit=args.time_limit,
                       lr_grid=args.lr_grid, lr_tokens=args.lr_tokens,
                       o_bases=args.o_basis if len(args.o_basis) > 1 else (),
                       log=lambda s: print(s, file=sys.stderr, flush=True))
    print(markdown_table(
        [f"{args.source} {cfg.tie}/{cfg.start}", "tokens", "ppl", "teacher ppl",
         "perplexity over the teacher's, per token (95% CI)", "KV cache ×", "tokens/s"],
        [["", f"{r['tokens']:,}", f"{r['ppl']:,.3f}", f"{r['ppl_teacher']:.3f}",
          f"{_gap(r['gap'])} ({_gap(r['gap_lo'])} to {_gap(r['gap_hi'])})", f"{r['kv_cache']:.2f}",
          f"{r['tokens_per_s']:.0f}" if r.get("tokens_per_s") else ""] for r in recs], cell=str))
    if args.out:
        print(f"wrote {args.out} (load it with qkvlab.hf.convert.load_converted)")
    return 0
