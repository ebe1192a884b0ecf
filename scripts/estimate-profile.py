"""Estimate a study profile's worker-seconds before running it: time 8 steps of every distinct
model/task/batch of its runs (one thread) and scale by each run's steps; evaluation
approximated by its batches, 2 s a run for start-up. Rates a tuning stage would choose are
faked at the task's rate. Usage: PYTHONPATH=src python scripts/estimate-profile.py standard
(on 2026-11-25 a partial real sweep of standard took ~0.92x its estimate, quick ~0.78x).
"""
import collections
import dataclasses
import json
import sys

import torch

from qkvlab.experiments.registry import EXPERIMENTS, get_profile
from qkvlab.studies.qkv.plan import profiles as rates_, rates
from qkvlab.studies.qkv.plan.experiments import ORDER
from qkvlab.train.trainer import run_from_spec
from qkvlab.experiments.store import run_id

name = sys.argv[1]
torch.set_num_threads(1)
p = get_profile(name)
lrs = {key: rates.lr_of(key[0], 1.0, p) for key in rates.tuned_keys(p)}
lrs |= {("lm", tag, "equal", d, i): rates.lr_of("lm", 1.0, p)
        for tag, d, i in rates.placement_keys(p)}
p = dataclasses.replace(p, rates=rates_.Rates(lrs=lrs))
runs = {}
for e in ORDER:
    try:
        for s, t in EXPERIMENTS[e](p):
            runs[run_id(s)] = (e, s)
    except Exception as ex:  # e.g. pending stages of other kinds
        print("skip", e, type(ex).__name__, ex, file=sys.stderr)
groups = collections.defaultdict(list)
for rid, (e, s) in runs.items():
    d = s.to_dict()
    tr = d["train"]
    key = json.dumps({"task": d["task"], "opts": d["task_options"], "kind": d.get("kind"),
                      "model": d["model"], "bs": tr["batch_size"], "init": d.get("init"),
                      "probe": d.get("probe")}, sort_keys=True)
    groups[key].append((e, s))
print(len(runs), "runs,", len(groups), "distinct configs", file=sys.stderr)
total, per_exp, per_task = 0.0, collections.Counter(), collections.Counter()
for i, (key, members) in enumerate(groups.items()):
    e, s = members[0]
    n = 8
    probe = s.train.replace(steps=n, eval_every=0, eval_batches=1, test_batches=0, keep_at=(),
                            checkpoint_every=0, warmup=1) if hasattr(s.train, "replace") else \
        dataclasses.replace(s.train, steps=n, eval_every=0, eval_batches=1, keep_at=(),
                            checkpoint_every=0, warmup=1)
    spec = s.replace(train=probe)
    r = run_from_spec(spec, progress=False)
    step = r.timings["step"] / n
    ev = r.timings["eval"]  # one eval of 1 batch (translate: with its decode)
    for e2, s2 in members:
        t = s2.train
        n_evals = (t.steps // t.eval_every if t.eval_every else 1)
        tb = getattr(t, "test_batches", 0)
        cost = t.steps * step + ev * (n_evals * t.eval_batches + tb) + 2.0  # + setup
        total += cost
        per_exp[e2] += cost
        per_task[s2.task] += cost
    print(f"{i + 1}/{len(groups)} {s.task} {step * 1000:.1f} ms/step x{len(members)}",
          file=sys.stderr, flush=True)
print(json.dumps({"profile": name, "runs": len(runs), "worker_s": round(total),
                  "per_experiment": {k: round(v) for k, v in per_exp.most_common()},
                  "per_task": {k: round(v) for k, v in per_task.most_common()}}, indent=1))
