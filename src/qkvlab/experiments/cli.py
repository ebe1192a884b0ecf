"""Commands ``sweep``, ``experiments`` and ``results``: a ``configure_<cmd>(parser)`` and a
``run_<cmd>(args) -> int`` each, wired into ``qkvlab`` by ``qkvlab.cli``.

    qkvlab experiments [--profile quick]
    qkvlab sweep NAME [NAME ...]|all [--profile smoke|quick|full] [--workers N]
                 [--backend local|ray] [--db PATH] [--tensorboard DIR]
    qkvlab results NAME|all [--profile P] [--format table|csv|json|parquet] [--out PATH]
                   [--stats METRIC] [--errors] [--db PATH]
"""

from __future__ import annotations

import argparse
import math
import shlex
import sys
import time
from pathlib import Path

from qkvlab.experiments.frames import EXPORT_FORMATS, export, runs_frame
from qkvlab.experiments.pool import BACKENDS, DEFAULT_WORKERS
from qkvlab.experiments.registry import describe, experiment_names, profile_names
from qkvlab.experiments.runner import failure_report, sweep
from qkvlab.experiments.store import DEFAULT_DB, Store
from qkvlab.inputs import print_error
from qkvlab.train.distributed import use_device


def _common(parser: argparse.ArgumentParser, profile_default: str | None = "quick") -> None:
    parser.add_argument("--profile", default=profile_default, choices=profile_names(),
                        help="sizes: smoke (CI), quick (2-core CPU, minutes), full (GPU)")
    parser.add_argument("--db", default=str(DEFAULT_DB), help="results store (SQLite)")


def configure_sweep(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", nargs="+",
                        help="experiments (see `qkvlab experiments`) or `all`: they train as one "
                             "queue, each after the experiments whose results it needs")
    _common(parser)
    parser.add_argument("--workers", type=int, default=DEFAULT_WORKERS,
                        help=f"local worker processes (default {DEFAULT_WORKERS}: one per core, "
                             "at most 2, one thread each)")
    parser.add_argument("--backend", default="local", choices=list(BACKENDS),
                        help="local processes, or Ray tasks on an existing cluster (RAY_ADDRESS)")
    parser.add_argument("--threads", type=int, default=None,
                        help="torch threads per worker (default: cores / workers)")
    parser.add_argument("--device", default=None,
                        help="where the runs train: cpu, cuda or cuda:N (default: "
                             "$QKVLAB_DEVICE, else cuda where PyTorch sees a GPU, else cpu)")
    parser.add_argument("--tensorboard", default=None, metavar="DIR",
                        help="also log every run's metrics for TensorBoard under DIR "
                             "(needs the tensorboard package)")
    parser.add_argument("--task-module", action="append", default=[], metavar="MODULE",
                        help="allow runs whose task is MODULE:Class (MODULE's code runs; "
                             "repeat for several)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")


def run_sweep(args: argparse.Namespace) -> int:
    """Run the sweep; print the counts and, if runs failed, the first failure's exception and
    the command that prints every traceback. Exit status 2 for bad arguments (nothing is
    created), 1 if any run failed."""
    t0 = time.perf_counter()
    name = args.name[0] if len(args.name) == 1 else args.name
    try:
        use_device(args.device)
        counts = sweep(name, args.profile, workers=args.workers, backend=args.backend,
                       db=args.db, progress=not args.no_progress, threads=args.threads,
                       tensorboard=args.tensorboard, task_modules=args.task_module,
                       log=lambda m: print(m, file=sys.stderr))  # the time breakdown, always
    except ValueError as e:
        return print_error("qkvlab sweep", e)  # on its own line, after any progress bar
    took = time.perf_counter() - t0
    print(f"sweep {' '.join(args.name)} [{args.profile}]: " +
          ", ".join(f"{k} {v}" for k, v in sorted(counts.items())) +
          f" in {took:.1f} s -> {args.db}")
    if not counts.get("failed"):
        return 0
    with Store(args.db, readonly=True) as store:
        print(failure_report(store, name, args.profile), file=sys.stderr)
    return 1


def configure_experiments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--profile", default="quick", choices=profile_names())


def run_experiments(args: argparse.Namespace) -> int:
    rows = describe(args.profile)
    w = max(len(r["experiment"]) for r in rows)
    print(f"{'experiment':<{w}}  runs  question   [profile {args.profile}]")
    for r in rows:
        n = "  —" if r["distinct"] is None else r["distinct"]  # runs depend on stored results
        print(f"{r['experiment']:<{w}}  {n:>4}  {r['question']}")
    if any(r["distinct"] is None for r in rows):
        print("—: runs depend on results of an earlier experiment (e.g. learning rates chosen "
              "by lr_tune)")
    return 0


def configure_results(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", help="an experiment or `all`")
    _common(parser, profile_default=None)
    parser.add_argument("--format", default="table", choices=list(EXPORT_FORMATS))
    parser.add_argument("--out", default=None, help="write to this file instead of stdout")
    parser.add_argument("--stats", default=None, metavar="METRIC",
                        help="print mean ± 95%% CI over seeds and the paired difference vs "
                             "standard for METRIC (e.g. val_loss, accuracy)")
    parser.add_argument("--errors", action="store_true",
                        help="print the full traceback of every failed run")


def _sweep_hint(name: str, profile: str | None, db: str) -> str:
    """``; run `qkvlab sweep ...``` when that command would work, else nothing."""
    if name != "all" and name not in experiment_names():
        return f" ({name!r} is not a registered experiment; see `qkvlab experiments`)"
    cmd = ["qkvlab", "sweep", name, "--profile", profile or "quick"]
    if Path(db) != Path(DEFAULT_DB):
        cmd += ["--db", db]
    return f"; run `{shlex.join(cmd)}`"


def run_results(args: argparse.Namespace) -> int:
    """Print or write stored results; exit status 1 if the store holds none, 2 for a bad
    argument, a missing --db (never created) or a file that is not a results database."""
    hint = _sweep_hint(args.name, args.profile, args.db)
    if not Path(args.db).exists():  # a path that names nothing is a bad argument
        return print_error("qkvlab results", ValueError(f"db: no results database at "
                                                        f"{args.db}{hint}"))
    try:
        with Store(args.db, readonly=True) as store:  # a read command: never writes
            name = None if args.name == "all" else args.name
            rows = store.runs(name, args.profile)
            df = runs_frame(store, name, args.profile)
        if not rows:
            at = f" at profile {args.profile}" if args.profile else ""
            print(f"qkvlab results: error: no runs of {args.name!r}{at} in {args.db}{hint}",
                  file=sys.stderr)
            return 1
        if args.errors:
            print(format_errors(rows))
            return 0
        if args.stats:
            from qkvlab.stats import compare  # scipy: only this command needs it

            check_metric(args.stats, rows)

            print(format_stats(compare(rows, args.stats), args.stats))
            return 0
        text = export(df, args.format, args.out)
    except ValueError as e:
        return print_error("qkvlab results", e)
    if text is not None:
        print(text)
    else:
        print(f"wrote {args.out}")
    return 0


def check_metric(metric: str, rows: list[dict]) -> None:
    """Refuse a ``--stats`` metric that no run of ``rows`` records a final value of (it gave a
    table of NaNs): one line listing those they record."""
    known = sorted({k for r in rows for k in r["final"]})
    if metric not in known:
        have = ", ".join(known) if known else "none yet"
        raise ValueError(f"--stats: unknown metric {metric!r}; the runs shown record: {have}")


def _f(x, digits: int = 4) -> str:
    return "nan" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{digits}g}"


def format_errors(rows: list[dict]) -> str:
    """Every failed run of ``rows`` once: id, experiment, tags and the stored traceback."""
    seen, out = set(), []
    for r in rows:
        if r["status"] != "failed" or r["id"] in seen:
            continue
        seen.add(r["id"])
        tags = " ".join(f"{k}={v}" for k, v in (r["tags"] or {}).items())
        out.append(f"== run {r['id']} ({r['experiment']} [{r['profile']}] {tags})\n"
                   f"{(r.get('error') or '(no traceback recorded)').rstrip()}")
    return "\n\n".join(out) if out else "no failed runs"


def format_stats(rows: list[dict], metric: str) -> str:
    """A plain-text table of ``stats.compare`` rows."""
    skip = {"design", "n", "mean", "sd", "half", "lo", "hi", "diverged", "n_params",
            "baseline_mean", "baseline_params", "diff", "diff_half", "diff_lo", "diff_hi", "p",
            "rel_pct", "rel_half", "n_pairs", "diff_sd", "rel_sd", "failed", "lost_value",
            "baseline_lost", "lost"}
    lines = []
    for r in rows:
        group = " ".join(f"{k}={v}" for k, v in r.items() if k not in skip)
        s = (f"{group:<40} {r['design']:<18} {metric} {_f(r['mean'])} ± {_f(r['half'], 2)} "
             f"(n={r['n']}, params {r['n_params']})")
        if "diff" in r:
            s += (f"  vs standard: {_f(r['diff'], 3)} ± {_f(r['diff_half'], 2)}"
                  f" ({_f(r['rel_pct'], 3)}% ± {_f(r['rel_half'], 2)}%), p={_f(r['p'], 2)}")
        if r["diverged"] or r["failed"]:
            s += f"  diverged {r['diverged']}, failed {r['failed']}"
        lines.append(s)
    return "\n".join(lines)

