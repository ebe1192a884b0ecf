"""``qkvlab analyze SOURCE``: W_Q/W_K/W_V similarity of one checkpoint against random nulls."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from qkvlab.analysis.measures import PUBLISHED_SOURCE, PUBLISHED_SYMMETRY
from qkvlab.analysis.run import analyze
from qkvlab.inputs import MEMORY_ENV, InputFileError, parse_bytes, print_error
from qkvlab.tables import markdown_table

# Rows of the printed summary: symmetry and the three subspace overlaps answer the question.
PRINTED = ("symmetry", "symmetry_layer", "symmetry_layer_median", "positive_share", "overlap_qk",
           "overlap_kv", "overlap_qv", "copying", "cka_qk", "cka_kv", "cka_qv")


def configure_analyze(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("source", metavar="SOURCE",
                        help="zoo name (qkvlab zoo), a local HF folder, GGUF file, CTranslate2 "
                             "model.bin, ONNX ViT (.onnx), Marian .bin, qkvlab checkpoint or run "
                             "folder, or a hub id owner/name when a network is available")
    parser.add_argument("--out", default=None,
                        help="output folder (default: analysis/<model name>)")
    parser.add_argument("--null", type=int, default=128, dest="n_null",
                        help="random heads per layer shape for the nulls (default 128)")
    parser.add_argument("--verses", type=int, default=24,
                        help="KJV verses the model reads for the activation CKA (default 24)")
    parser.add_argument("--no-cka", action="store_true", help="skip running the model on text")
    parser.add_argument("--no-figures", action="store_true", help="tables only")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random nulls")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    parser.add_argument("--max-memory", default=None, metavar="SIZE",
                        help="refuse inputs whose loading needs more memory than SIZE "
                             f"(e.g. 64G; default ${MEMORY_ENV}, else 16G)")


def run_analyze(args) -> int:
    for name in ("n_null", "verses"):
        if getattr(args, name) < 2:
            print(f"error: --{name.replace('n_', '')}: must be at least 2", file=sys.stderr)
            return 2
    out = Path(args.out) if args.out else Path("analysis") / Path(args.source).name
    try:
        if args.max_memory is not None:  # for this process and what it starts
            os.environ[MEMORY_ENV] = str(parse_bytes(args.max_memory))
        res = analyze(args.source, out, n_null=args.n_null, cka=not args.no_cka,
                      n_verses=args.verses, seed=args.seed, figures=not args.no_figures,
                      progress=not args.quiet)
    except (InputFileError, FileNotFoundError, ValueError) as e:  # on its own line, after the bar
        return print_error("qkvlab analyze", e if isinstance(e, ValueError) else ValueError(e))
    meta = res["meta"]
    print(f"{res['model']} ({meta['family']}, {meta['n_heads']} heads, d_model {meta['d_model']},"
          f" d_head {meta['d_head']}); null = {meta['n_null']} random heads of the same shapes")
    for note in meta["notes"]:
        print(f"note: {note}")
    print(markdown_table(
        ["role", "measure", "mean over heads", "null mean [95%]", "heads above null"],
        [[s["role"], s["measure"], f"{s['mean']:.3f} ± {s['std']:.3f}",
          f"{s['null_mean']:.3f} [{s['null_lo']:.3f}, {s['null_hi']:.3f}]",
          f"{s['share_above_null']:.0%}"] for s in res["summary"] if s["measure"] in PRINTED],
        cell=str))
    print("published symmetry s, median over layers as symmetry_layer_median (" +
          PUBLISHED_SOURCE + "; not measured here): " +
          ", ".join(f"{k} {v:g}" for k, v in PUBLISHED_SYMMETRY.items()))
    print(f"wrote {out}/measures.csv, summary.csv, measures.json"
          + ("" if args.no_figures else ", heatmaps.png/.svg, null.png/.svg")
          + f" in {res['timings']['total_s']:.1f} s")
    return 0
