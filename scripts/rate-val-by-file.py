"""Where two uptraining rates part on the val split, file by file (a diagnostic of hf.rate's
choice, not part of the study; prints, stores nothing).

For one model, tie and start, each rate uptrains a fresh student for hf.rate.TOKENS tokens
exactly as ``qkvlab convert --lr-grid`` does, then the teacher and every student are scored on
the whole val split (256-token rows). Printed: each student's perplexity over the teacher's on
the split's first 16,384 tokens (what hf.rate version 2 read), on rows spread over the split
(version 3), on all of it, and per file.

    python scripts/rate-val-by-file.py smollm2 9e-6 1e-4 [--tie kv --start fitted --threads 2]
"""

import argparse
import dataclasses
import math
import tempfile
import time

import torch

from qkvlab.data import pysource
from qkvlab.hf.convert import ConvertConfig, make_student, token_rows
from qkvlab.hf.cost import load_lm
from qkvlab.hf.rate import TOKENS, VAL_TOKENS
from qkvlab.hf.uptrain import Uptrainer, sequence_nll
from qkvlab.train.precision import autocast, resolve_precision

p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
p.add_argument("model")
p.add_argument("rates", nargs="+", type=float)
p.add_argument("--tie", default="kv")
p.add_argument("--start", default="fitted")
p.add_argument("--threads", type=int, default=None)
args = p.parse_args()
if args.threads:
    torch.set_num_threads(args.threads)
t0 = time.time()
teacher, tok = load_lm(args.model)
teacher.eval()
cfg = ConvertConfig(tie=args.tie, start=args.start, tokens=TOKENS)
u = cfg.uptrain
calib = token_rows(tok, "train", cfg.calib_tokens, u.seq_len)
train = token_rows(tok, "train", cfg.steps * u.tokens_per_step, u.seq_len, skip=cfg.calib_tokens)
precision = resolve_precision(u.precision, "cpu")
students = {}
for lr in args.rates:
    s = make_student(teacher, cfg, calib)
    with tempfile.TemporaryDirectory() as tmp:
        Uptrainer(s, teacher, train, dataclasses.replace(u, lr=lr), tmp,
                  lambda: autocast(precision, "cpu")).run_to(cfg.steps)
    students[lr] = s.eval()
    print(f"rate {lr:g}: {cfg.steps} steps ({time.time() - t0:.0f} s)", flush=True)

ids, owner = [], []
for rel, text in pysource.source_splits(None)["val"]:
    got = tok(text + pysource.SEPARATOR, add_special_tokens=False)["input_ids"]
    ids += got
    owner += [rel] * len(got)
n = len(ids) // u.seq_len
rows = torch.tensor(ids[:n * u.seq_len]).view(n, u.seq_len)
with torch.no_grad():
    nll = {"teacher": sequence_nll(teacher, rows)}
    for lr, s in students.items():
        nll[lr] = sequence_nll(s, rows)
print(f"val split: {n} rows of {u.seq_len} ({time.time() - t0:.0f} s)")


def ratio(who, idx):
    per = len(idx) * (u.seq_len - 1)
    return math.exp(sum(nll[who][i] - nll["teacher"][i] for i in idx) / per)


want = VAL_TOKENS // u.seq_len
spread = torch.linspace(0, n - 1, want).round().long().tolist()
head = "".join(f"{lr:>12g}" for lr in args.rates)
print(f"{'perplexity over the teacher on':44s}{head}")
for what, idx in ((f"the first {want} rows (hf.rate v2)", range(want)),
                  (f"{want} rows spread over the split (v3)", spread),
                  (f"all {n} rows", range(n))):
    print(f"{what:44s}" + "".join(f"{'x%.2f' % ratio(lr, idx):>12s}" for lr in args.rates))
files = {}
for i in range(n):
    files.setdefault(owner[i * u.seq_len], []).append(i)
for f, idx in files.items():
    print(f"{f + f' ({len(idx)} rows)':44s}"
          + "".join(f"{'x%.2f' % ratio(lr, idx):>12s}" for lr in args.rates))
