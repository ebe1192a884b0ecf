"""Estimate a study profile's worker-seconds before running it: time 8 steps of every distinct
model/task/batch of its runs (one thread) and scale by each run's steps; evaluation
approximated by its batches, 2 s a run for start-up. Rates a tuning stage would choose are
faked at the task's rate; stages that wait on others' runs (the head-width cells, the
controlled conversion) are planned as if those had finished with every grid choosing its
middle point (so no edge runs), and any still waiting is listed as pending, not estimated.

Usage: PYTHONPATH=src python scripts/estimate-profile.py standard [--cache FILE]
[--set FIELD=VALUE ...]. With ``--cache`` each configuration's timed step and evaluation are
kept in FILE (JSON) and read from it when present, so a changed plan is re-estimated without
timing again what it shares with the last one (the file is this machine's: time again on
another). ``--set`` replaces a field of the profile by a Python literal (e.g.
``--set "scale_train_seeds=(0, 1, 2, 3)"``), to price a change before making it.
Calibration: on 2026-11-25 a partial real sweep of standard took ~0.92x its estimate, quick
~0.78x; the fresh-clone standard run of 2037346 ~0.85x.
"""
import argparse
import ast
import collections
import dataclasses
import json
import math
import sys
from pathlib import Path

import torch

from qkvlab.experiments.registry import EXPERIMENTS, get_profile
from qkvlab.experiments.store import run_id
from qkvlab.studies.qkv.plan import profiles as rates_, rates
from qkvlab.studies.qkv.plan.experiments import ORDER
from qkvlab.train.trainer import run_from_spec

ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
ap.add_argument("profile")
ap.add_argument("--cache", type=Path, default=None, help="JSON of timed configurations")
ap.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                help="replace a profile field by a Python literal")
args = ap.parse_args()
cache = json.loads(args.cache.read_text()) if args.cache and args.cache.is_file() else {}
torch.set_num_threads(1)
p = get_profile(args.profile)
for item in args.set:
    field, _, value = item.partition("=")
    p = dataclasses.replace(p, **{field: ast.literal_eval(value)})
lrs = {key: rates.lr_of(key[0], 1.0, p) for key in rates.tuned_keys(p)}
lrs |= {("lm", tag, "equal", d, i): rates.lr_of("lm", 1.0, p)
        for tag, d, i in rates.placement_keys(p)}
p = dataclasses.replace(p, rates=rates_.Rates(lrs=lrs))
runs, tags = {}, {}


def plan(p) -> list[str]:
    """Add ``p``'s runs to ``runs``; return the experiments that wait on others' runs."""
    waiting = []
    for e in ORDER:
        try:
            for s, t in EXPERIMENTS[e](p):
                runs[run_id(s)] = (e, s)
                tags[run_id(s)] = t
        except Exception:  # RatesPending, ParentsPending: stages that read earlier runs
            waiting.append(e)
    return waiting


pending = plan(p)
if pending:
    # a second pass as if every run planned so far had finished, each tuning grid choosing its
    # middle (the task's rate: val loss |ln(lr / rate)|), so no choice sits on an edge
    done = {rid: ("done", abs(math.log(t["lr"] / rates.lr_of(runs[rid][1].task, 1.0, p)))
                  if "lr" in t else 1.0) for rid, t in tags.items()}
    p = dataclasses.replace(p, rates=dataclasses.replace(p.rates, stored=done))
    pending = plan(p)
for e in pending:
    print("pending", e, "(not estimated)", file=sys.stderr)
groups = collections.defaultdict(list)
for rid, (e, s) in runs.items():
    d = s.to_dict()
    tr = d["train"]
    key = json.dumps({"task": d["task"], "opts": d["task_options"], "kind": d.get("kind"),
                      "model": d["model"], "bs": tr["batch_size"], "init": d.get("init"),
                      "probe": d.get("probe")}, sort_keys=True)
    groups[key].append((e, s))
print(len(runs), "runs,", len(groups), "distinct configs", file=sys.stderr)
total, per_exp, per_task, per_both = 0.0, collections.Counter(), collections.Counter(), \
    collections.Counter()
for i, (key, members) in enumerate(groups.items()):
    if key not in cache:
        e, s = members[0]
        n = 8
        probe = dataclasses.replace(s.train, steps=n, eval_every=0, eval_batches=1,
                                    keep_at=(), checkpoint_every=0, warmup=1)
        if hasattr(s.train, "test_batches"):
            probe = dataclasses.replace(probe, test_batches=0)
        r = run_from_spec(s.replace(train=probe), progress=False)
        # one step, and one eval of 1 batch (translate: with its decode)
        cache[key] = (r.timings["step"] / n, r.timings["eval"])
        if args.cache:
            args.cache.write_text(json.dumps(cache))
        print(f"{i + 1}/{len(groups)} {s.task} {cache[key][0] * 1000:.1f} ms/step "
              f"x{len(members)}", file=sys.stderr, flush=True)
    step, ev = cache[key]
    for e2, s2 in members:
        t = s2.train
        n_evals = (t.steps // t.eval_every if t.eval_every else 1)
        tb = getattr(t, "test_batches", 0)
        cost = t.steps * step + ev * (n_evals * t.eval_batches + tb) + 2.0  # + setup
        total += cost
        per_exp[e2] += cost
        per_task[s2.task] += cost
        per_both[f"{e2} {s2.task}"] += cost
print(json.dumps({"profile": args.profile, "set": args.set, "runs": len(runs),
                  "worker_s": round(total), "pending": pending,
                  "per_experiment": {k: round(v) for k, v in per_exp.most_common()},
                  "per_task": {k: round(v) for k, v in per_task.most_common()},
                  "per_experiment_task": {k: round(v) for k, v in per_both.most_common()}},
                 indent=1))
