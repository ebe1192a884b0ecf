"""The whole study on the smoke profile, then its page opened in headless Chromium.

Playwright drives Debian's ``chromium`` package through ``executable_path``: one pinned wheel
(the test extra) and one Debian package (``make browser``); ``playwright install`` is never run
(it downloads a browser build, which fails offline). Chosen over Selenium with Debian's
``chromium-driver`` after measuring both on a fresh Debian 12 venv as root (2026-11-25; both
then ran with no network at all): playwright 1.65.2 installs in 2 s (167 MB, its Node driver,
no browser), needs no second Debian package, passes ``--no-sandbox`` (root needs it) itself,
and reports console messages, uncaught exceptions and failed requests as events, so each error
class the old hand-written DevTools client caught is caught here. The newest selenium (4.52.0)
did not install from the index (it needs a newer certifi); 4.51.0 (2 s, 44 MB) needs
``chromium-driver`` too (2 s, 25 MB) and ``--no-sandbox`` by hand, its Selenium Manager reaches
for the Chrome-for-Testing catalogue and a stats server unless given the driver's path, and
errors come only as the browser log's text.

Fails (does not skip) without Chromium or Playwright: the report's promise is a page that
opens, so CI must install them (``make test`` does).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import matplotlib.image
import pytest

from qkvlab.studies.qkv.compute.agreement import agreement, read_verdicts
from qkvlab.studies.qkv.render.page import SECTION_IDS
from qkvlab.studies.qkv.study import StudyConfig, run_study

INSTALL_HINT = ("Chromium is not installed: on Debian/Ubuntu run "
                "`apt-get update && apt-get install -y chromium` (or `make browser` as root; "
                "then /usr/bin/chromium exists), or set QKVLAB_CHROMIUM to a Chromium/Chrome binary")
# Local schemes a self-contained report may load; anything else is reported and never fetched.
LOCAL = ("file:", "data:", "blob:", "about:")


def find_chromium() -> str:
    """Path of a Chromium binary; FileNotFoundError with the install command if none."""
    for c in (os.environ.get("QKVLAB_CHROMIUM"), "chromium", "chromium-browser", "google-chrome"):
        if c and (shutil.which(c) or Path(c).is_file()):
            return shutil.which(c) or c
    raise FileNotFoundError(INSTALL_HINT)


def check_page(index: Path, screenshot: Path, timeout: float = 60.0) -> dict:
    """Load ``index`` in headless Chromium and report what a reader would see.

    Returns:
        ``{"images": [{src, naturalWidth, complete}], "sections": [ids], "title": str,
        "errors": [text]}``; ``errors`` holds console errors and failed assertions, uncaught
        exceptions, failed loads and any request that would leave the machine (aborted).

    Raises:
        FileNotFoundError: no Chromium (the message says how to install it) or no ``index``.
    """
    from playwright.sync_api import sync_playwright

    index = Path(index).resolve()
    if not index.is_file():
        raise FileNotFoundError(f"{index}: no such report")
    binary, errors = find_chromium(), []
    with sync_playwright() as p:
        # Playwright's own flags already keep Chromium quiet offline (no background networking,
        # component updates, sync or first run) and add --no-sandbox, which root needs.
        browser = p.chromium.launch(executable_path=binary, timeout=timeout * 1000)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            page.set_default_timeout(timeout * 1000)
            page.on("console", lambda m: m.type in ("error", "assert")
                    and errors.append(f"console: {m.text} {m.location.get('url', '')}"))
            page.on("pageerror", lambda e: errors.append(f"exception: {e}"))
            page.on("requestfailed",
                    lambda r: errors.append(f"network: {r.failure} {r.url}"))

            def outside(route):
                errors.append(f"remote: {route.request.url}")
                route.abort()

            page.route(lambda url: not url.startswith(LOCAL), outside)
            page.goto(index.as_uri(), wait_until="load")
            info = page.evaluate("""() => ({
                images: Array.from(document.images).map(i => ({src: i.getAttribute('src'),
                         naturalWidth: i.naturalWidth, complete: i.complete})),
                sections: Array.from(document.querySelectorAll('section[id]')).map(s => s.id),
                cards: Array.from(document.querySelectorAll('.card')).map(c => c.id),
                title: document.title})""")
            screenshot = Path(screenshot)
            screenshot.parent.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(screenshot), full_page=False)
        finally:
            browser.close()
    return {**info, "errors": errors}


def test_smoke_study_opens_in_chromium(tmp_path):
    try:
        find_chromium()
    except FileNotFoundError as e:
        pytest.fail(str(e))
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        pytest.fail("Playwright is not installed: pip install -e '.[test]' (or make test)")
    cfg = StudyConfig(profile="smoke", db=str(tmp_path / "results" / "qkvlab.db"),
                      out=str(tmp_path / "reports"), workers=1, progress=False, log=print)
    index = run_study(cfg)
    folder = index.parent
    assert (folder / "report.md").is_file() and (folder / "verdicts.json").is_file()
    # its comparisons carry their verdicts, and a report agrees with itself cell by cell
    same = agreement(read_verdicts(folder), read_verdicts(folder))
    assert len(same) > 0 and set(same.relation) <= {"agree", "neither decides"}
    assert (same.verdict_a == same.verdict_b).all()
    res = check_page(index, folder / "screenshot.png")
    assert res["errors"] == []
    assert res["sections"] == list(SECTION_IDS)
    pngs = sorted(p.name for p in (folder / "figures").glob("*.png"))
    # every figure once in its section, and each card's figure again as its thumbnail
    assert sorted({i["src"].removeprefix("figures/") for i in res["images"]}) == pngs
    assert all(i["naturalWidth"] > 0 for i in res["images"])
    answers = json.loads((folder / "answers.json").read_text())
    assert res["cards"] == [f"card-{q}" for q in answers] == ["card-q1", "card-q2", "card-q3"]
    assert all(a["sentence"] and a["question"] for a in answers.values())
    assert len(pngs) >= 8
    assert "q3_uptrain.png" in pngs  # the controlled conversion ran through the study's stages
    assert [i for i in res["images"] if not (i["complete"] and i["naturalWidth"] > 0)] == []
    assert (folder / "screenshot.png").stat().st_size > 10_000
    shot = matplotlib.image.imread(folder / "screenshot.png")  # (900, 1280, RGBA) in [0, 1]
    assert shot.shape[:2] == (900, 1280)
    drawn = (abs(shot[..., :3] - shot[0, 0, :3]) > 0.1).any(axis=-1).mean()
    assert drawn > 0.02, f"screenshot is blank: {drawn:.1%} of pixels differ from the background"
    # the folder is self-contained: it still opens after a move, with nothing from the network
    moved = shutil.copytree(folder, tmp_path / "moved")
    again = check_page(moved / "index.html", tmp_path / "moved.png")
    assert again["errors"] == [] and all(i["naturalWidth"] > 0 for i in again["images"])
    assert again["sections"] == res["sections"] and len(again["images"]) == len(res["images"])
    print(f"screenshot: {folder / 'screenshot.png'}")
