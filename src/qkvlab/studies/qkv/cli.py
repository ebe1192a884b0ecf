"""``qkvlab study``: ``configure(parser)`` and ``run(args) -> int``, found by ``qkvlab.cli``
through the ``qkvlab.studies`` entry point.

    qkvlab study [--profile smoke|quick|full] [--db results/qkvlab.db] [--out reports]
                 [--workers N] [--no-pretrained] [--device cpu|cuda[:N]] [--no-progress]
    qkvlab study --agree REPORT_A REPORT_B     # e.g. reports/quick reports/standard
"""

from __future__ import annotations

import argparse
import math
import sys

from qkvlab.experiments.pool import DEFAULT_WORKERS
from qkvlab.experiments.registry import profile_names
from qkvlab.experiments.store import DEFAULT_DB
from qkvlab.inputs import print_error

HELP = "run everything behind the three questions and write the report"


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--profile", default="quick", choices=profile_names(),
                        help="smoke (CI, ~3 min), quick (2-core CPU, ≤15 min), full (GPU)")
    parser.add_argument("--db", default=str(DEFAULT_DB), help="results store (SQLite)")
    parser.add_argument("--out", default="reports", help="the report goes to OUT/PROFILE/")
    parser.add_argument("--workers", type=int, default=DEFAULT_WORKERS,
                        help=f"worker processes for the training runs (default {DEFAULT_WORKERS})")
    parser.add_argument("--no-pretrained", action="store_true",
                        help="skip the pretrained analysis (quick: MiniLM, Whisper tiny, "
                             "SmolLM2; full: the whole zoo, each model fetched or noted)")
    parser.add_argument("--device", default=None,
                        help="where the runs train: cpu, cuda or cuda:N (default: "
                             "$QKVLAB_DEVICE, else cuda where PyTorch sees a GPU, else cpu)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")
    parser.add_argument("--agree", nargs=2, metavar=("REPORT_A", "REPORT_B"),
                        help="train nothing: compare two written reports' verdicts cell by "
                             "cell (e.g. reports/quick reports/standard); exit status 1 if a "
                             "cell both decide reads differently")


def run(args: argparse.Namespace) -> int:
    # imported here, not at the top: the registry imports this study to list its experiments,
    # and sweeps should not pay for matplotlib and the report to do that
    from qkvlab.studies.qkv.study import StudyConfig, run_study
    from qkvlab.train.distributed import use_device

    if args.agree:
        return agree(*args.agree)
    try:
        use_device(args.device)
    except ValueError as e:
        return print_error("qkvlab study", e)
    cfg = StudyConfig(profile=args.profile, db=args.db, out=args.out, workers=args.workers,
                      progress=not args.no_progress,
                      pretrained=() if args.no_pretrained else None,  # None: the profile's
                      log=lambda m: print(m, file=sys.stderr))
    index = run_study(cfg)
    print(index.resolve())
    return 0


def agree(report_a: str, report_b: str) -> int:
    """Print the cells two reports both decide or either decides, contradictions first, and a
    count per relation; 1 if any cell contradicts, else 0."""
    from qkvlab.report.blocks import Table
    from qkvlab.studies.qkv.compute.agreement import Relation, agreement, read_verdicts

    df = agreement(read_verdicts(report_a), read_verdicts(report_b))
    shown = df[df.relation != Relation.NEITHER.value]
    tags = [c for c in ("experiment", "task", "metric", "arm", "m", "d_head", "design")
            if c in df and (df[c] != "").any()]

    names = {Relation.ONLY_A.value: f"only {report_a} decides",
             Relation.ONLY_B.value: f"only {report_b} decides"}

    def said(r: dict, side: str) -> str:
        v, half, unit = (r[f"effect{x}_{side}"] for x in ("", "_half", "_unit"))
        if not isinstance(v, float) or math.isnan(v):  # no effect to quote
            return r[f"verdict_{side}"]
        pm = f" ± {half:.3g}" if isinstance(half, float) and not math.isnan(half) else ""
        return f"{r[f'verdict_{side}']} {v:+.3g}{pm}{unit if isinstance(unit, str) else ''}"

    print(Table(f"{report_a} vs {report_b}: the cells either decides", (*tags, report_a,
                                                                        report_b, "relation"),
                tuple((*(str(r[c]) for c in tags), said(r, "a"), said(r, "b"),
                       names.get(r["relation"], r["relation"]))
                      for r in shown.to_dict("records")),
                empty="no cell either decides").markdown())
    counts = df.relation.value_counts()
    print("; ".join(f"{counts.get(r.value, 0)} {names.get(r.value, r.value)}" for r in Relation)
          + f" (of {len(df)} cells both reports hold)")
    return 1 if counts.get(Relation.CONTRADICT.value, 0) else 0
