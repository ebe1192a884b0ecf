"""The study's profiles divide the work: an experiment a profile leaves out of ``experiments``
lists no runs there, standard runs no translate, head-width or controlled-conversion runs, and
the kv profile runs those two on standard's own lm runs (the same ids, so one store trains
them once)."""
import dataclasses
import math

from conftest import scored
from qkvlab.experiments.registry import EXPERIMENTS, ResultsPending, get_profile, runs_of
from qkvlab.experiments.store import Store
from qkvlab.studies.qkv.compute import results
from qkvlab.studies.qkv.render import page
from qkvlab.experiments.store import run_id
from qkvlab.studies.qkv.plan import headwidth, rates, uptrain
from qkvlab.studies.qkv.plan.experiments import ORDER


def _with_rates(p):
    """``p`` as if lr_tune had chosen every rate at the task's own (no store needed)."""
    lrs = {key: rates.lr_of(key[0], 1.0, p) for key in rates.tuned_keys(p)}
    lrs |= {("lm", tag, "equal", d, i): rates.lr_of("lm", 1.0, p)
            for tag, d, i in rates.placement_keys(p)}
    return dataclasses.replace(p, rates=dataclasses.replace(p.rates, lrs=lrs))


def test_a_profile_lists_runs_only_for_its_experiments():
    kv = get_profile("kv")
    assert set(kv.experiments) < set(ORDER)
    for name in set(ORDER) - set(kv.experiments):
        assert EXPERIMENTS[name](kv) == [], name
    assert EXPERIMENTS["lr_tune"](kv)  # one it keeps
    # every profile without a list keeps them all
    assert all(not get_profile(n).experiments for n in ("smoke", "quick", "standard", "full"))


def test_kv_tunes_lm_only_and_shares_standard_lm_runs():
    std, kv = get_profile("standard"), get_profile("kv")
    # lm only, and only the designs its experiments compare (K=V in both arms, GQA), with
    # standard and the control
    assert set(rates.tuned_keys(kv)) == {("lm", d, "equal") for d in (
        "standard", "tied_kv", "gqa_half", "control")} | {("lm", "tied_kv", "matched")}
    kv_tune = {run_id(s) for s, _ in EXPERIMENTS["lr_tune"](kv)}
    std_lm = {run_id(s) for s, t in EXPERIMENTS["lr_tune"](std) if s.task == "lm"}
    assert kv_tune < std_lm and len(kv_tune) == 5 * len(kv.lr_grid) * len(kv.lr_seeds)
    kv_runs = {run_id(s) for s, _ in EXPERIMENTS["lm_tied_kv"](_with_rates(kv))}
    std_runs = {run_id(s) for s, t in EXPERIMENTS["lm_tied_kv"](_with_rates(std))
                if s.task == "lm"}
    assert kv_runs == std_runs and kv_runs


def test_standard_leaves_translate_the_head_width_axis_and_the_conversion_to_others():
    std = _with_rates(get_profile("standard"))
    assert "translate" not in {t for t, _, _ in rates.tuned_keys(std)}
    for name in ORDER:
        try:
            runs = EXPERIMENTS[name](std)
        except ValueError:  # a stage waiting on stored choices (the grids' edges)
            continue
        assert all(s.task != "translate" for s, _ in runs), name
    assert headwidth.cells(std) == () and uptrain.tuning_runs(std) == []
    kv = get_profile("kv")
    assert headwidth.cells(kv) and kv.uptrain_fractions
    # smoke and full still train translate
    assert any(s.task == "translate" for s, _ in EXPERIMENTS["alt_vs_standard"](
        _with_rates(get_profile("smoke"))))


def _loss(tags: dict, p) -> float:
    """A stored test loss: the task's rate best on every grid, the control far behind, each
    other design a little behind standard, a seed's noise."""
    off = {"standard": 0.0, "control": 0.5}.get(tags["design"], 0.05)
    lr = tags.get("lr")
    miss = abs(math.log(lr / rates.lr_of("lm", 1.0, p))) * 0.01 if lr else 0.0
    return 4.0 + off + miss + 0.002 * (tags.get("seed", 0) % 5)


def test_a_kv_store_runs_its_stages_and_writes_a_report(tmp_path):
    """The kv profile end to end through a real store, with stored losses instead of
    training: each stage is listed from what the store holds (the tuning grids, then the
    comparisons, the head-width cells and the controlled conversion), and its report is
    written with the head-width and conversion tables."""
    p = get_profile("kv")
    db = tmp_path / "kv.db"
    with Store(db) as store:
        counts = {}
        for _ in range(3):  # stages wait on earlier ones: list again once those are stored
            for name in p.experiments:
                try:
                    runs = runs_of(name, p, store)
                except ResultsPending:
                    continue
                counts[name] = len(runs)
                for rid, (_, t) in zip(store.add(name, p.name, runs), runs):
                    if store.claim(rid):
                        v = _loss(t, p)
                        store.finish(rid, "done", 1, scored({"val_loss": v})
                                     if t.get("seed", 0) < 100 else {"val_loss": v},
                                     {"n_params": 1})
        assert set(counts) == set(p.experiments)
        assert counts["lr_tune_edge"] == counts["head_width_tune_edge"] == 0  # middle wins
        assert counts["head_width"] and counts["lm_convert"]
        tasks = {s.task for name in p.experiments for s, _ in runs_of(name, p, store)}
        assert tasks == {"lm"}
        data = results.load(store, p.name)
    index = page.write_report(data, tmp_path / "report")
    md = (tmp_path / "report" / "report.md").read_text()
    q3 = md[md.index("### Q3"):md.index("### Each answer in full")]
    assert "(head width)" in q3 and "standard lm converted to K=V (fitted start)" in q3
    assert "Scale: the kv profile" in md and index.is_file()
