"""Regenerate docs/convert.md's conversion table, sentence and figure from a store's convert
records: `python scripts/convert-report.py [DB|-] [FIGURE_DIR] [--add JSON ...] [--bench JSON ...]
[--doc docs/convert.md] [--readme README.md] [--rows-out JSON --what TEXT]` (defaults
results/qkvlab.db, docs/figures).

With ``--doc`` the generated part (table, sentence, figure, the bench's tables) replaces what
lies between the page's two ``convert-report`` markers, so no number on it is typed by hand;
without it the part is printed. With ``--readme`` the README's line on the conversions (each
model's K=V curve measured furthest against its untied baseline) replaces what lies between
its two ``convert`` markers.

Reads a copy of the store (a live sweep may be writing it); trains nothing. ``--add`` puts the
measure rows a device machine's store gave (kept as JSON in docs/convert/) into that copy
first, so its curves are drawn beside the store's own. The numbers are the study's own
(``compute.convert``), worded and drawn by its render functions.

A store does not outlive its machine, so what the page draws is kept in the repo as those rows:
``--rows-out`` writes DB's own conversion rows (teacher, rate choices, curves) to JSON, and DB
``-`` starts from an empty store, so that the page is made from the kept JSON alone."""

import argparse
import json
import os
import sqlite3
import sys
import tempfile
from pathlib import Path

from qkvlab.bench.convert import convert_table
from qkvlab.experiments.registry import get_profile
from qkvlab.experiments.store import Store
from qkvlab.experiments.transfer import add_measure_rows
from qkvlab.studies.qkv.compute import results
from qkvlab.studies.qkv.render.convert import (
    convert_blocks,
    convert_headline,
    convert_sentence,
    fig_q3_convert,
    start_blocks,
)
from qkvlab.studies.qkv.render.convert_rates import rate_blocks

MEASURES = ("convert_teacher", "convert_lr", "convert")  # what the page reads of a store
BEGIN, END = "<!-- convert-report: begin -->", "<!-- convert-report: end -->"
README_MARKS = "<!-- convert: begin -->", "<!-- convert: end -->"
p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
p.add_argument("db", nargs="?", default="results/qkvlab.db",
               help="the store to read; '-' for none (only the --add rows)")
p.add_argument("figures", nargs="?", default="docs/figures")
p.add_argument("--add", action="append", default=[], metavar="JSON",
               help="measure rows kept as JSON ({'rows': [...]}) to add to the copy")
p.add_argument("--bench", action="append", default=[], metavar="JSON",
               help="a `qkvlab bench --only convert --out` JSON whose table goes on the page")
p.add_argument("--doc", default=None, help="the page whose generated part is replaced")
p.add_argument("--readme", default=None, help="the README whose conversion line is replaced")
p.add_argument("--rows-out", default=None, metavar="JSON",
               help="write DB's own conversion measure rows here (for docs/convert/)")
p.add_argument("--what", default="", help="with --rows-out: what the rows are, in words")
args = p.parse_args()
if args.rows_out and args.db == "-":
    sys.exit("--rows-out: name the store (DB) whose rows to write")
out = Path(args.figures)
copy = Path(tempfile.mkdtemp()) / "copy.db"
if args.db != "-":
    if not Path(args.db).is_file():
        sys.exit(f"{args.db}: no store there (give '-' to draw only the --add rows)")
    src, dst = sqlite3.connect(f"file:{args.db}?mode=ro", uri=True), sqlite3.connect(copy)
    src.backup(dst)
    dst.close()
with Store(copy) as store:
    if args.rows_out:
        rows = [r for name in MEASURES for r in store.measure_rows(name)]
        Path(args.rows_out).write_text(json.dumps({"what": args.what, "rows": rows}) + "\n")
        print(f"wrote {len(rows)} rows to {args.rows_out}")
    for path in args.add:
        add_measure_rows(store, json.loads(Path(path).read_text())["rows"])
    data = results.load(store, get_profile("convert"))
fig = fig_q3_convert(data, out)
part = [convert_sentence(data, None)]  # every tie: the page is the conversions; words first
part += [block.markdown() for block in start_blocks(data) + convert_blocks(data)
         + rate_blocks(data)]
if fig:
    img = out / fig.png
    link = os.path.relpath(img, Path(args.doc).parent) if args.doc else img
    part.append(f"![Converting a trained decoder to a tie, then uptraining it]({link})")
for path in args.bench:
    res = json.loads(Path(path).read_text())
    part.append(f"Speed, `qkvlab bench --only convert` ({res['cpu_model']}, {res['device']}; "
                f"`{path}`):\n\n" + convert_table(res["convert"]))
text = "\n\n".join(part)


def write_between(path: str, marks: tuple[str, str], body: str) -> None:
    """Replace what lies between ``path``'s two markers with ``body``."""
    page = Path(path).read_text()
    head, sep, rest = page.partition(marks[0])
    _, sep2, tail = rest.partition(marks[1])
    if not (sep and sep2):
        sys.exit(f"{path}: no '{marks[0]}' ... '{marks[1]}' markers to write between")
    Path(path).write_text(f"{head}{marks[0]}\n{body}\n{marks[1]}{tail}")


if args.readme:
    write_between(args.readme, README_MARKS, convert_headline(data))
    print(f"wrote {args.readme}'s conversion line")
if args.doc:
    write_between(args.doc, (BEGIN, END), text)
    print(f"wrote {args.doc} and {out / fig.png if fig else 'no figure'}")
elif not args.readme:
    print(text)
