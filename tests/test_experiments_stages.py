"""A sweep of several experiments trains them as one queue, in stages: an experiment whose runs
depend on another's results (``ResultsPending``) is listed and trained once the other's results
are stored; one whose prerequisite failed is refused with its reason, the rest kept."""

from __future__ import annotations

import dataclasses
from contextlib import contextmanager

import pytest

from conftest import temporary_experiment, toy_runs
from qkvlab.experiments import registry
from qkvlab.experiments.registry import Profile, ResultsPending
from qkvlab.experiments.runner import experiment_names, sweep, sweep_ids
from qkvlab.experiments.store import Store

FIRST, THEN, PROFILE = "toy_first", "toy_then", "toy_staged"


@dataclasses.dataclass(frozen=True)
class StagedProfile(Profile):
    """Knows from the store whether toy_first has a finished run (like lr_tune's rates)."""

    first_done: bool = False

    def prepared(self, store) -> StagedProfile:
        done = store is not None and any(r["status"] == "done" for r in store.runs(FIRST, self.name))
        return dataclasses.replace(self, first_done=done)


def then_runs(p: StagedProfile) -> list:
    if not p.first_done:
        raise ResultsPending(f"{THEN} needs {FIRST}'s results; run `qkvlab sweep {FIRST}` first")
    return toy_runs(seed=1)


@contextmanager
def staged(first_runs):
    smoke = registry.get_profile("smoke")
    base = {f.name: getattr(smoke, f.name) for f in dataclasses.fields(Profile)}
    registry.register_profile(StagedProfile(**{**base, "name": PROFILE}))
    try:
        with temporary_experiment(FIRST, first_runs), temporary_experiment(THEN, []):
            registry.EXPERIMENTS[THEN] = then_runs
            yield
    finally:
        registry.PROFILES.pop(PROFILE)


def test_dependent_experiment_trains_in_a_second_stage_after_its_prerequisite(tmp_path):
    db, printed = tmp_path / "r.db", []
    with staged(toy_runs()):
        # listed first, but its runs wait for toy_first's results
        counts = sweep([THEN, FIRST], PROFILE, db=db, workers=1, threads=1, progress=False,
                       log=printed.append)
        assert counts == {"done": 4}
        with Store(db) as store:
            first = {r["id"]: r for r in store.runs(FIRST, PROFILE)}
            then = {r["id"]: r for r in store.runs(THEN, PROFILE)}
            assert len(first) == len(then) == 2 and not set(first) & set(then)
            assert max(r["finished"] for r in first.values()) <= min(r["started"] for r in then.values())
            assert sorted(sweep_ids([FIRST, THEN], PROFILE, store)) == sorted([*first, *then])
        heads = [m.splitlines()[0] for m in printed]
        assert [h.split(":")[0] for h in heads] == [f"sweep {FIRST} [{PROFILE}]", f"sweep {THEN} [{PROFILE}]",
                                                    f"sweep {THEN}, {FIRST} [{PROFILE}]"]
        assert [h.split(": ")[1].split(" trained")[0] for h in heads] == ["2 runs", "2 runs", "4 runs"]
        # everything stored: a second sweep trains nothing, in one stage
        printed.clear()
        assert sweep([THEN, FIRST], PROFILE, db=db, threads=1, progress=False, log=printed.append) == {"done": 4}
        assert len(printed) == 1 and ": 0 runs trained in " in printed[0]


def test_dependent_experiment_alone_on_a_new_store_is_refused_before_anything_is_written(tmp_path):
    db = tmp_path / "r.db"
    with staged(toy_runs()), pytest.raises(ResultsPending, match=f"run `qkvlab sweep {FIRST}` first"):
        sweep(THEN, PROFILE, db=db, progress=False)
    assert not db.exists()


def test_a_failed_prerequisite_refuses_the_dependent_experiment_and_keeps_its_own_results(tmp_path):
    broken = [({"task": "test_experiments_store:BrokenTask", "model": {"d_model": 16},
                "train": {"seed": 0}}, {"design": "standard", "seed": 0})]
    db = tmp_path / "r.db"
    with staged(broken), pytest.raises(ResultsPending, match=f"{THEN} needs {FIRST}"):
        sweep([FIRST, THEN], PROFILE, db=db, threads=1, progress=False)
    with Store(db) as store:
        assert [r["status"] for r in store.runs(FIRST, PROFILE)] == ["failed"]
        assert store.runs(THEN, PROFILE) == []


def test_experiment_names_of_a_list_keep_its_order_once_each_and_name_a_bad_one():
    every = registry.experiment_names()
    assert experiment_names(["lr_tune", "scale_probe", "lr_tune"]) == ["lr_tune", "scale_probe"]
    assert experiment_names(["lr_tune", "all"]) == ["lr_tune", *(e for e in every if e != "lr_tune")]
    assert experiment_names("all") == every
    with pytest.raises(ValueError, match="unknown 'nope'"):
        experiment_names(["lr_tune", "nope"])
    with pytest.raises(ValueError, match="no name given"):
        experiment_names([])


GROW, AFTER, GROWING = "toy_grow", "toy_after", "toy_growing"


@dataclasses.dataclass(frozen=True)
class GrowingProfile(Profile):
    """Counts toy_grow's finished runs, as a rate followed past its grid's edge counts the
    points it has reached."""

    grown: int = 0

    def prepared(self, store) -> GrowingProfile:
        n = 0 if store is None else sum(r["status"] == "done" for r in store.runs(GROW, self.name))
        return dataclasses.replace(self, grown=n)


def grow_runs(p: GrowingProfile) -> list:
    """One run more each time the last has finished, at most three (like ``follow_edge``)."""
    return [toy_runs(seed=s)[0] for s in range(min(3, p.grown + 1))]


def after_runs(p: GrowingProfile) -> list:
    if p.grown < 3:
        raise ResultsPending(f"{AFTER} needs all of {GROW}'s runs")
    return toy_runs(seed=9)[1:]


def test_an_experiment_that_grows_with_its_results_is_listed_again_until_it_stops(tmp_path):
    db, printed = tmp_path / "r.db", []
    smoke = registry.get_profile("smoke")
    base = {f.name: getattr(smoke, f.name) for f in dataclasses.fields(Profile)}
    registry.register_profile(GrowingProfile(**{**base, "name": GROWING}))
    try:
        with temporary_experiment(GROW, []), temporary_experiment(AFTER, []):
            registry.EXPERIMENTS[GROW], registry.EXPERIMENTS[AFTER] = grow_runs, after_runs
            counts = sweep([AFTER, GROW], GROWING, db=db, workers=1, threads=1, progress=False,
                           log=printed.append)
            with Store(db) as store:
                grown = sorted(store.runs(GROW, GROWING), key=lambda r: r["started"])
                after = store.runs(AFTER, GROWING)
    finally:
        registry.PROFILES.pop(GROWING)
    # three stages of toy_grow, each run after the one before had finished, then toy_after
    assert counts == {"done": 4}
    assert [r["spec"]["train"]["seed"] for r in grown] == [0, 1, 2]
    assert all(a["finished"] <= b["started"] for a, b in zip(grown, grown[1:]))
    assert len(after) == 1 and after[0]["started"] >= grown[-1]["finished"]
    heads = [m.splitlines()[0].split(":")[0] for m in printed]
    assert heads == [f"sweep {GROW} [{GROWING}]"] * 3 + [f"sweep {AFTER} [{GROWING}]",
                                                         f"sweep {AFTER}, {GROW} [{GROWING}]"]
