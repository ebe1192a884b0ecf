"""Regenerate docs/convert.md's conversion table, sentence and figure from a store's convert
records: `python scripts/convert-report.py [DB] [FIGURE_DIR]` (defaults results/qkvlab.db,
docs/figures).

Reads a copy of the store (a live sweep may be writing it); trains nothing. The numbers are the
study's own (``compute.convert``), worded and drawn by its render functions."""

import sqlite3
import sys
import tempfile
from pathlib import Path

from qkvlab.experiments.registry import get_profile
from qkvlab.experiments.store import Store
from qkvlab.studies.qkv.compute import results
from qkvlab.studies.qkv.render.convert import convert_blocks, convert_sentence, fig_q3_convert

db = sys.argv[1] if len(sys.argv) > 1 else "results/qkvlab.db"
out = Path(sys.argv[2] if len(sys.argv) > 2 else "docs/figures")
copy = Path(tempfile.mkdtemp()) / "copy.db"
src, dst = sqlite3.connect(f"file:{db}?mode=ro", uri=True), sqlite3.connect(copy)
src.backup(dst)
dst.close()
with Store(copy) as store:
    data = results.load(store, get_profile("convert"))
fig = fig_q3_convert(data, out)
for block in convert_blocks(data):
    print(block.markdown())
print()
print(convert_sentence(data))
print(f"\nfigure: {out / fig.png}" if fig else "\nno convert records in this store")
