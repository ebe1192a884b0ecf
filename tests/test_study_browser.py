"""The whole study on the smoke profile, then its page opened in headless Chromium.

Fails (does not skip) without Chromium: the report's promise is a page that opens, so CI must
install it (`apt-get install -y chromium`).
"""

from __future__ import annotations

import shutil

import pytest

from qkvlab.report import browser
from qkvlab.studies.qkv.render.page import SECTION_IDS
from qkvlab.studies.qkv.study import StudyConfig, run_study


def test_smoke_study_opens_in_chromium(tmp_path):
    try:
        browser.find_chromium()
    except FileNotFoundError as e:
        pytest.fail(str(e))
    cfg = StudyConfig(profile="smoke", db=str(tmp_path / "results" / "qkvlab.db"),
                      out=str(tmp_path / "reports"), workers=1, progress=False, log=print)
    index = run_study(cfg)
    folder = index.parent
    assert (folder / "report.md").is_file() and (folder / "verdicts.json").is_file()
    res = browser.check_page(index, folder / "screenshot.png")
    assert res["errors"] == []
    assert res["sections"] == list(SECTION_IDS)
    pngs = sorted(p.name for p in (folder / "figures").glob("*.png"))
    assert sorted(i["src"].removeprefix("figures/") for i in res["images"]) == pngs
    assert len(pngs) >= 8
    assert [i for i in res["images"] if not (i["complete"] and i["naturalWidth"] > 0)] == []
    assert (folder / "screenshot.png").stat().st_size > 10_000
    # the folder is self-contained: it still opens after a move, with nothing from the network
    moved = shutil.copytree(folder, tmp_path / "moved")
    again = browser.check_page(moved / "index.html", tmp_path / "moved.png")
    assert again["errors"] == [] and all(i["naturalWidth"] > 0 for i in again["images"])
    print(f"screenshot: {folder / 'screenshot.png'}")
