"""``torchrun --nproc_per_node N -m qkvlab.train spec.json --out result.json``: one run spec,
data-parallel (gloo on CPU, NCCL on GPU; see ``qkvlab.train.distributed``).

Without torchrun (``python -m qkvlab.train spec.json --out result.json``) it trains the spec
in this one process. The spec is the JSON of one run config, as ``run_from_spec`` takes it:
``{task, task_options, kind, model, train}``.
"""

from __future__ import annotations

import argparse
import json
import sys

from qkvlab.fileio import atomic_open
from qkvlab.train.distributed import setup, teardown
from qkvlab.train.trainer import run_from_spec


def main(argv: list[str] | None = None) -> int:
    """Train one run spec under torchrun; rank 0 writes the result JSON to ``--out``.

    Raises:
        ValueError: the spec is invalid (from ``run_from_spec``).
        OSError: the spec cannot be read or the result cannot be written.
    """
    p = argparse.ArgumentParser(prog="torchrun --nproc_per_node N -m qkvlab.train")
    p.add_argument("spec", help="JSON file: {task, task_options, kind, model, train}")
    p.add_argument("--out", required=True, help="where rank 0 writes the result JSON")
    p.add_argument("--run-dir", default=None, help="checkpoint folder (resumes from it)")
    args = p.parse_args(argv)
    with open(args.spec) as f:
        spec = json.load(f)
    info = setup()
    try:
        result = run_from_spec(spec, run_dir=args.run_dir, dist_info=info, progress=False)
        if info.main:
            with atomic_open(args.out, "w") as f:
                json.dump(result.to_dict(), f, indent=1)
    finally:
        teardown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
