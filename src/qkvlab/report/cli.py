"""``qkvlab study``: ``configure_study(parser)`` and ``run_study(args) -> int``, wired by qkvlab.cli.

    qkvlab study [--profile smoke|quick|full] [--db results/qkvlab.db] [--out reports]
                 [--workers N] [--no-pretrained] [--no-progress]
"""

from __future__ import annotations

import argparse
import os
import sys


def configure_study(parser: argparse.ArgumentParser) -> None:
    from qkvlab.report import sources as S

    parser.add_argument("--profile", default="quick", choices=S.profile_names(),
                        help="smoke (CI, ~3 min), quick (2-core CPU, ≤15 min), full (GPU)")
    parser.add_argument("--db", default=str(S.DEFAULT_DB), help="results store (SQLite)")
    parser.add_argument("--out", default="reports", help="the report goes to OUT/PROFILE/")
    parser.add_argument("--workers", type=int, default=min(2, os.cpu_count() or 1),
                        help="worker processes for the training runs")
    parser.add_argument("--no-pretrained", action="store_true",
                        help="skip the analysis of MiniLM, Whisper tiny and SmolLM2")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")


def run_study(args: argparse.Namespace) -> int:
    from qkvlab.report.study import PRETRAINED, StudyConfig
    from qkvlab.report.study import run_study as _run

    try:
        cfg = StudyConfig(profile=args.profile, db=args.db, out=args.out, workers=args.workers,
                          progress=not args.no_progress,
                          pretrained=() if args.no_pretrained else PRETRAINED,
                          log=lambda m: print(m, file=sys.stderr))
        index = _run(cfg)
    except ValueError as e:
        print(f"qkvlab study: error: {e}", file=sys.stderr)
        return 2
    print(index.resolve())
    return 0
