"""Issue 41, runs and their files under a kill or a full disk, one test per case: the study's
report is written as a set (1); a killed checkpoint save's temp file is never a checkpoint and
is removed (2); a non-finite or out-of-range number in a config is one line naming the field
(3); a store whose text is not UTF-8 is one line naming the row (4); a full disk mid-sweep
marks the run failed and ends the sweep in one line (5)."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from qkvlab.experiments.store import Store


def tree(folder: Path) -> dict[str, bytes]:
    """Every file under ``folder`` by its relative path, with its bytes."""
    return {str(p.relative_to(folder)): p.read_bytes()
            for p in sorted(folder.rglob("*")) if p.is_file()}


# ---- 1: the report is written as a set ----------------------------------------------------------
def test_a_report_that_fails_midway_leaves_the_old_report_whole(tmp_path, monkeypatch):
    from qkvlab.studies.qkv.compute import results
    from qkvlab.studies.qkv.render import page

    with Store(tmp_path / "r.db") as store:
        data = results.load(store, "smoke")
    out = tmp_path / "reports" / "smoke"
    (out / "figures").mkdir(parents=True)
    for name in ("index.html", "report.md", "verdicts.json", "comparisons.csv",
                 "figures/stale.png"):  # an older report, whole
        (out / name).write_text(f"old {name}")
    old = tree(out)

    def fail(*a, **k):
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(page, "with_verdicts", fail)  # the CSV, written after index.html
    with pytest.raises(OSError, match="No space left"):
        page.write_report(data, out)
    assert tree(out) == old and os.listdir(out.parent) == ["smoke"]  # no partial folder left
    monkeypatch.undo()
    assert page.write_report(data, out) == out / "index.html"
    new = tree(out)  # the new report replaced the old folder whole: no stale figure
    assert set(new) == {"index.html", "report.md", "verdicts.json", "comparisons.csv"}
    assert all(new[k] != old[k] for k in new) and os.listdir(out.parent) == ["smoke"]
