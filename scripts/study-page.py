"""Regenerate the generated part of a docs page from a study store's runs: `python
scripts/study-page.py PART DB [--profile kv] [--figures docs/figures] [--doc PAGE]`.

PART is one of:

- ``controlled-convert``: the controlled conversion (experiment ``lm_convert``,
  ``studies/qkv/plan/uptrain.py``), for docs/controlled-convert.md. `qkvlab sweep lr_tune
  lr_tune_edge lm_tied_kv uptrain_tune uptrain_tune_edge lm_convert --profile kv --db DB`
  trains its runs;
- ``head-width``: K=V's head-width axis (experiment ``head_width``,
  ``studies/qkv/plan/headwidth.py``), for docs/head-width.md. `qkvlab sweep head_width_tune
  head_width_tune_edge head_width --profile kv --db DB` trains its runs.

Both sweeps are resumable, and `qkvlab study --profile kv` (`make report PROFILE=kv`) runs
them both. Until 2026-11-29 they were part of the standard profile (stores of that time read
with ``--profile standard``). With
``--doc`` the generated part replaces what lies between the page's two ``PART`` markers, so no
number on it is typed by hand; without it the part is printed. Reads a copy of the store (a
live sweep may be writing it); trains nothing.
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
from qkvlab.studies.qkv.render.headwidth import fig_q3_head_width, head_width_blocks
from qkvlab.studies.qkv.render.uptrain import fig_q3_uptrain, uptrain_blocks


def _gate(data) -> str:
    ctl = data.compared("lm_tied_kv", task="lm", design="control", arm="equal",
                        metric="val_loss")
    if ctl.empty:
        return ""
    e = effect(ctl.iloc[0].to_dict())
    return (f" lm's attention-free control against standard on the same seeds: {e.value:+.1f} "
            f"± {e.half:.1f}% perplexity per token ({e.status.value}), so standard "
            + ("uses attention here and the verdicts stand." if attention_used(
                ctl.iloc[0].to_dict()) else "does not beat it and no verdict is read."))


def _convert_head(data, prof, ran: str) -> str:
    return (f"Profile {prof.name}: the parent is standard lm trained {steps_of(prof):,} steps "
            f"on seeds {', '.join(map(str, prof.seeds))}; {ran}.{_gate(data)}")


def _width_head(data, prof, ran: str) -> str:
    cells = ", ".join(f"{m}/{h}×{m // h}" for m, h in prof.head_width_cells)
    return (f"Profile {prof.name}: lm trained {steps_of(prof):,} steps on seeds "
            f"{', '.join(map(str, prof.seeds))} in the cells (d_model/heads×d_head) {cells}; "
            f"{ran}. Each cell's own control gates it (the table's control column).")


# part -> (experiment, head, blocks, figure, alt text)
PARTS = {"controlled-convert": ("lm_convert", _convert_head, uptrain_blocks, fig_q3_uptrain,
                                "Converting the study's own lm to K=V"),
         "head-width": ("head_width", _width_head, head_width_blocks, fig_q3_head_width,
                        "K=V's cost against head width")}

p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
p.add_argument("part", choices=sorted(PARTS))
p.add_argument("db")
p.add_argument("--profile", default="kv")
p.add_argument("--figures", default="docs/figures")
p.add_argument("--doc", default=None, help="the page whose generated part is replaced")
args = p.parse_args()
experiment, head, blocks, figure, alt = PARTS[args.part]
copy = Path(tempfile.mkdtemp()) / "copy.db"
src, dst = sqlite3.connect(f"file:{args.db}?mode=ro", uri=True), sqlite3.connect(copy)
src.backup(dst)
dst.close()
prof = get_profile(args.profile)
with Store(copy) as store:
    data = results.load(store, prof)
    ran = [r for r in store.runs(experiment, prof.name) if r["status"] in ("done", "diverged")]
if not ran:
    raise SystemExit(f"{args.db}: no finished {experiment} runs at profile {prof.name}")
cpu = (ran[0]["hardware"] or {}).get("cpu_model", "an unrecorded CPU")
worker_s = sum(r["wall_s"] or 0.0 for r in {r["id"]: r for r in ran}.values())
fig = figure(data, Path(args.figures))
counted = (f"{len({r['id'] for r in ran})} runs of the store ({worker_s:,.0f} worker-seconds "
           f"on {cpu})")
part = [head(data, prof, counted), *(b.markdown() for b in blocks(data))]
if fig:
    img = Path(args.figures) / fig.png
    link = os.path.relpath(img, Path(args.doc).parent) if args.doc else img
    part.append(f"![{alt}]({link})")
text = "\n\n".join(part)
if args.doc:
    begin, end = f"<!-- {args.part}: begin -->", f"<!-- {args.part}: end -->"
    page = Path(args.doc).read_text()
    before, _, rest = page.partition(begin)
    _, _, after = rest.partition(end)
    Path(args.doc).write_text(f"{before}{begin}\n{text}\n{end}{after}")
print(text)
