"""``qkvlab study``: ``configure(parser)`` and ``run(args) -> int``, found by ``qkvlab.cli``
through the ``qkvlab.studies`` entry point.

    qkvlab study [--profile smoke|quick|full] [--db results/qkvlab.db] [--out reports]
                 [--workers N] [--no-pretrained] [--device cpu|cuda[:N]] [--no-progress]
"""

from __future__ import annotations

import argparse
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


def run(args: argparse.Namespace) -> int:
    # imported here, not at the top: the registry imports this study to list its experiments,
    # and sweeps should not pay for matplotlib and the report to do that
    from qkvlab.studies.qkv.study import StudyConfig, run_study
    from qkvlab.train.distributed import use_device

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
