"""Regenerate docs/controlled-convert.md's table, sentence and figure from a study store's
controlled conversion (experiment ``lm_convert``, ``studies/qkv/plan/uptrain.py``):
`python scripts/controlled-convert.py DB [--profile standard] [--figures docs/figures]
[--doc docs/controlled-convert.md]`.

The runs are the study's: `qkvlab sweep lr_tune lm_tied_kv uptrain_tune uptrain_tune_edge
lm_convert --profile standard --db DB` trains them (resumable; `qkvlab study` does the same as
part of the whole study). With ``--doc`` the generated part replaces what lies between the
page's two ``controlled-convert`` markers, so no number on it is typed by hand; without it the
part is printed. Reads a copy of the store (a live sweep may be writing it); trains nothing.
"""

import argparse
import os
import sqlite3
import tempfile
from pathlib import Path

from qkvlab.experiments.registry import get_profile
from qkvlab.experiments.store import Store
from qkvlab.studies.qkv.compute import results
from qkvlab.studies.qkv.compute.effects import attention_used, effect
from qkvlab.studies.qkv.plan.uptrain import steps_of
from qkvlab.studies.qkv.render.uptrain import fig_q3_uptrain, uptrain_blocks

BEGIN, END = "<!-- controlled-convert: begin -->", "<!-- controlled-convert: end -->"
p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
p.add_argument("db")
p.add_argument("--profile", default="standard")
p.add_argument("--figures", default="docs/figures")
p.add_argument("--doc", default=None, help="the page whose generated part is replaced")
args = p.parse_args()
copy = Path(tempfile.mkdtemp()) / "copy.db"
src, dst = sqlite3.connect(f"file:{args.db}?mode=ro", uri=True), sqlite3.connect(copy)
src.backup(dst)
dst.close()
prof = get_profile(args.profile)
with Store(copy) as store:
    data = results.load(store, prof)
    ran = [r for r in store.runs("lm_convert", prof.name) if r["status"] in ("done", "diverged")]
if not ran:
    raise SystemExit(f"{args.db}: no finished lm_convert runs at profile {prof.name}")
cpu = (ran[0]["hardware"] or {}).get("cpu_model", "an unrecorded CPU")
worker_s = sum(r["wall_s"] or 0.0 for r in {r["id"]: r for r in ran}.values())
fig = fig_q3_uptrain(data, Path(args.figures))
ctl = data.compared("lm_tied_kv", task="lm", design="control", arm="equal", metric="val_loss")
gate = ""
if not ctl.empty:
    e = effect(ctl.iloc[0].to_dict())
    gate = (f" lm's attention-free control against standard on the same seeds: {e.value:+.1f} "
            f"± {e.half:.1f}% perplexity per token ({e.status.value}), so standard "
            + ("uses attention here and the verdicts stand." if attention_used(
                ctl.iloc[0].to_dict()) else "does not beat it and no verdict is read."))
head = (f"Profile {prof.name}: the parent is standard lm trained {steps_of(prof):,} steps on "
        f"seeds {', '.join(map(str, prof.seeds))}; {len({r['id'] for r in ran})} runs of the "
        f"store ({worker_s:,.0f} worker-seconds on {cpu}).{gate}")
part = [head, *(b.markdown() for b in uptrain_blocks(data))]
if fig:
    img = Path(args.figures) / fig.png
    link = os.path.relpath(img, Path(args.doc).parent) if args.doc else img
    part.append(f"![Converting the study's own lm to K=V]({link})")
text = "\n\n".join(part)
if args.doc:
    page = Path(args.doc).read_text()
    before, _, rest = page.partition(BEGIN)
    _, _, after = rest.partition(END)
    Path(args.doc).write_text(f"{before}{BEGIN}\n{text}\n{END}{after}")
print(text)
