"""``torchrun --nproc_per_node N -m qkvlab.train spec.json --out result.json``: one run spec,
data-parallel (gloo on CPU, NCCL on GPU; see ``qkvlab.train.distributed``).

Without torchrun (``python -m qkvlab.train spec.json --out result.json``) it trains the spec
in this one process. The spec is the JSON of one run config, as ``run_from_spec`` takes it:
``{task, task_options, kind, model, train}``.

The spec is read and checked whole (``load_spec``) before any process group starts, so a bad
one is one line (on rank 0 only under torchrun: every rank reads the same file) and exit
status 2 from every rank; any other failure is one line naming it, status 1. ``--debug`` (or
``QKVLAB_DEBUG=1``) prints the traceback instead.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from qkvlab.fileio import atomic_open
from qkvlab.inputs import print_error
from qkvlab.train.build import allow_task_modules
from qkvlab.train.config import load_spec
from qkvlab.train.distributed import setup, teardown
from qkvlab.train.trainer import run_from_spec

PROG = "qkvlab.train"


def main(argv: list[str] | None = None) -> int:
    """Train one run spec under torchrun; rank 0 writes the result JSON to ``--out``.

    Returns:
        0, 2 for a bad spec or argument (one line on stderr), 1 for any other failure.
    """
    p = argparse.ArgumentParser(prog="torchrun --nproc_per_node N -m qkvlab.train")
    p.add_argument("spec", help="JSON file: {task, task_options, kind, model, train}")
    p.add_argument("--out", required=True, help="where rank 0 writes the result JSON")
    p.add_argument("--run-dir", default=None, help="checkpoint folder (resumes from it)")
    p.add_argument("--task-module", action="append", default=[], metavar="MODULE",
                   help="allow a spec's module:Class task from MODULE (its code runs; repeat "
                        "for several)")
    p.add_argument("--debug", action="store_true", help="on an error, print its traceback")
    args = p.parse_args(argv)
    debug = args.debug or os.environ.get("QKVLAB_DEBUG") == "1"
    quiet = os.environ.get("RANK", "0") != "0"  # the other ranks fail the same way: say it once
    try:
        allow_task_modules(*args.task_module)
        spec = load_spec(args.spec)
        info = setup()
        try:
            result = run_from_spec(spec, run_dir=args.run_dir, dist_info=info, progress=False)
            if info.main:
                with atomic_open(args.out, "w") as f:
                    json.dump(result.to_dict(), f, indent=1)
        finally:
            teardown()
    except Exception as e:  # noqa: BLE001 (the entry point: every failure becomes one line)
        if quiet and not debug and isinstance(e, ValueError):
            return 2
        return print_error(PROG, e, debug)
    return 0


if __name__ == "__main__":
    sys.exit(main())
