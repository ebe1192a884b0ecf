"""The results store and the training entry, one test per finding: a read command never writes
to a database (3); a store's checkpoints are its own (4); ``qkvlab.train`` and bad ``--db``
paths end in one line (5); threads are recorded per run and a sweep's time breakdown counts
only the runs it trained (7)."""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import temporary_experiment, toy_runs
from qkvlab.experiments import cli
from qkvlab.experiments.runner import sweep, sweep_ids
from qkvlab.experiments.schema import APPLICATION_ID, SCHEMA
from qkvlab.experiments.store import Store
from qkvlab.inputs import InputFileError

TESTS = Path(__file__).resolve().parent


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def stranger(path: Path, journal: str = "delete") -> Path:
    """Another program's SQLite database, with a ``runs`` table of its own."""
    c = sqlite3.connect(path)
    c.execute(f"PRAGMA journal_mode={journal}")
    c.execute("CREATE TABLE runs (id INTEGER PRIMARY KEY, name TEXT, status TEXT)")
    c.execute("INSERT INTO runs (name, status) VALUES ('mine', 'ok')")
    c.commit()
    c.close()
    return path


def parser(configure):
    import argparse

    p = argparse.ArgumentParser()
    configure(p)
    return p


@pytest.fixture
def toy():
    with temporary_experiment("toy_hostile", toy_runs(checkpoint_every=4)) as name:
        yield name


# ---- 3: a read command wrote into a stranger's database --------------------------------------------
@pytest.mark.parametrize("journal", ["delete", "wal"])
def test_results_on_a_strangers_database_changes_nothing(tmp_path, capsys, journal):
    db = stranger(tmp_path / "other.db", journal)
    before = digest(db)
    assert cli.run_results(parser(cli.configure_results).parse_args(["all", "--db", str(db)])) == 2
    err = capsys.readouterr().err
    assert "not a qkvlab results database" in err and "tables ['runs']" in err
    assert digest(db) == before and sorted(p.name for p in tmp_path.iterdir()) == ["other.db"]
    with pytest.raises(InputFileError, match="qkvlab leaves it as it is"):
        Store(db)  # nor does a write command take it over
    assert digest(db) == before and sorted(p.name for p in tmp_path.iterdir()) == ["other.db"]


def test_a_store_from_before_the_marker_reads_unchanged_and_migrates_on_a_write(tmp_path, toy):
    db = tmp_path / "old.db"
    with sqlite3.connect(db) as c:  # qkvlab's tables as an older qkvlab left them: no marker
        c.executescript(SCHEMA.replace("CREATE TABLE IF NOT EXISTS store_meta (key TEXT "
                                       "PRIMARY KEY, value TEXT);", "").replace(
            ", timings TEXT", ""))
    before = digest(db)
    with Store(db, readonly=True) as s:
        assert s.runs() == [] and s.runs_dir == tmp_path / "runs"
    assert digest(db) == before and not Path(f"{db}-wal").exists()
    assert sweep(toy, "smoke", db=db, threads=1, progress=False) == {"done": 2}
    with Store(db, readonly=True) as s:
        assert s.conn.execute("PRAGMA application_id").fetchone()[0] == APPLICATION_ID
        assert {"timings", "threads", "trained_by"} <= s._columns
        assert s.runs_dir == tmp_path / "runs"  # its checkpoints stay where they were
    assert all((tmp_path / "runs" / rid / "model.safetensors").is_file()
               for rid in sweep_ids(toy, "smoke"))


def test_a_read_only_store_refuses_writes(tmp_path):
    with Store(tmp_path / "r.db") as s:
        s.add("x", "smoke", [({"a": 1}, {})])
    with Store(tmp_path / "r.db", readonly=True) as s, pytest.raises(ValueError, match="read-only"):
        s.add("x", "smoke", [({"a": 2}, {})])
    with pytest.raises(InputFileError, match="no results database at"):
        Store(tmp_path / "missing.db", readonly=True)
    assert not (tmp_path / "missing.db").exists()


# ---- 4: two stores shared one checkpoint folder ------------------------------------------------------
def test_a_new_store_never_resumes_another_stores_checkpoint(tmp_path, toy):
    from qkvlab.train import run_from_spec

    a, b = tmp_path / "a.db", tmp_path / "b.db"
    with Store(a) as sa, Store(b) as sb:
        assert sa.runs_dir == tmp_path / "a.db-runs" and sb.runs_dir == tmp_path / "b.db-runs"
    spec, _ = toy_runs(checkpoint_every=4)[0]
    rid = sweep_ids(toy, "smoke")[0]
    # a killed sweep into a.db, or a store of the old layout, left a checkpoint at step 8
    half = {**spec, "train": {**spec["train"], "steps": 8}}
    for folder in (tmp_path / "a.db-runs" / rid, tmp_path / "runs" / rid):
        run_from_spec(half, run_dir=folder, progress=False)
        assert (folder / "checkpoint.safetensors").is_file()
    assert sweep(toy, "smoke", db=b, threads=1, progress=False) == {"done": 2}
    with Store(b, readonly=True) as s:
        steps = sorted({m["step"] for m in s.metrics(rid)})
    assert steps[0] <= 2, f"b.db's run starts at step {steps[0]}: it resumed a's checkpoint"


# ---- 5: tracebacks at the edges --------------------------------------------------------------------------
def run_train(tmp_path, spec_path, *extra, torchrun=False):
    env = {**os.environ, "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(TESTS), str(TESTS.parent / "src"),
                                          os.environ.get("PYTHONPATH", "")])}
    launch = ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"] if torchrun else []
    return subprocess.run([sys.executable, *launch, "-m", "qkvlab.train", str(spec_path), "--out",
                           str(tmp_path / "out.json"), *extra], capture_output=True, text=True,
                          timeout=300, env=env)


@pytest.mark.parametrize("content, words", [
    ({"task": "lm", "train": {"stpes": 3}}, "train.stpes: unknown key"),
    ({"task": "lm", "model": {"n_layers": 100_000}}, "n_layers: 100,000 is above the limit"),
    ({"task": "lm", "task_options": {"seq_lne": 8}}, "lm.seq_lne: unknown key"),
    ("not json {", "not a JSON run spec"), (None, "no such file")])
def test_train_entry_prints_one_line_and_exits_2(tmp_path, capsys, content, words):
    from qkvlab.train.__main__ import main

    spec = tmp_path / "spec.json"
    if content is not None:
        spec.write_text(content if isinstance(content, str) else json.dumps(content))
    assert main([str(spec), "--out", str(tmp_path / "out.json")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"qkvlab.train: error: {spec}: ") and words in err


def test_train_entry_as_a_command_one_line_or_the_traceback_with_debug(tmp_path):
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({"task": "lm", "train": {"stpes": 3}}))
    p = run_train(tmp_path, spec)
    assert p.returncode == 2 and p.stderr.count("\n") == 1 and "train.stpes" in p.stderr
    p = run_train(tmp_path, spec, "--debug")
    assert p.returncode == 2 and "Traceback (most recent call last)" in p.stderr


@pytest.mark.slow
def test_torchrun_entry_prints_the_workers_error_once_without_its_traceback(tmp_path):
    spec = tmp_path / "bad.json"
    spec.write_text(json.dumps({"task": "lm", "train": {"stpes": 3}}))
    p = run_train(tmp_path, spec, torchrun=True)
    assert p.returncode != 0
    ours = [ln for ln in p.stderr.splitlines() if ln.startswith("qkvlab.train: error:")]
    assert len(ours) == 1 and "train.stpes: unknown key" in ours[0]
    assert "qkvlab/train/" not in p.stderr  # no frame of the worker: torchrun's summary only


def test_db_that_is_a_folder_is_one_line(tmp_path, capsys, toy):
    (tmp_path / "d").mkdir()
    args = parser(cli.configure_sweep).parse_args([toy, "--profile", "smoke", "--db",
                                                   str(tmp_path / "d"), "--no-progress"])
    assert cli.run_sweep(args) == 2
    assert cli.run_results(parser(cli.configure_results).parse_args(
        ["all", "--db", str(tmp_path / "d")])) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and all("is a folder, not a results database" in e for e in err)


# ---- 7: numbers that depend on what is not recorded -----------------------------------------------------
def test_threads_are_recorded_and_a_breakdown_counts_only_its_own_runs(tmp_path, toy):
    db = tmp_path / "r.db"
    assert sweep(toy, "smoke", db=db, threads=1, progress=False) == {"done": 2}
    ids = sweep_ids(toy, "smoke")
    from qkvlab.experiments.frames import runs_frame

    with Store(db) as s:
        assert list(runs_frame(s, toy, "smoke")["threads"]) == [1, 1]
        assert set(s.timings(ids, since=0)) == set(ids)  # trained by this process
        # another sweep process trained the second run, at the same time as this one
        s.conn.execute("UPDATE runs SET trained_by='elsewhere:1' WHERE id=?", (ids[1],))
        assert list(s.timings(ids, since=0)) == [ids[0]]
        assert list(s.timings(ids)) == ids  # without ``since``: every run with timings


def test_a_spec_changed_by_hand_in_the_store_is_not_trained(tmp_path, toy):
    db = tmp_path / "r.db"
    sweep(toy, "smoke", db=db, threads=1, progress=False)
    rid = sweep_ids(toy, "smoke")[0]
    with Store(db) as s:
        spec = s.runs_spec(rid)
        spec["train"]["steps"] = 3
        s.conn.execute("UPDATE runs SET spec=?, status='pending' WHERE id=?",
                       (json.dumps(spec), rid))
    before = digest(db)
    with pytest.raises(InputFileError, match=f"run {rid}: the spec stored under this id hashes "
                                             "to .*; the store is damaged or was changed by hand"):
        sweep(toy, "smoke", db=db, threads=1, progress=False)
    assert digest(db) == before  # refused before any write: nothing trained, nothing marked


# ---- issue 41: nothing a store or a spec names is imported without the user's opt-in ------------
def planted(tmp_path: Path, monkeypatch) -> tuple[Path, dict]:
    """A module on the path that leaves a file when imported, and a spec naming its task."""
    ran = tmp_path / "ran"
    (tmp_path / "planted_task.py").write_text(f"open({str(ran)!r}, 'w').write('imported')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    spec, _ = toy_runs()[0]
    return ran, {**spec, "task": "planted_task:Evil"}


REFUSED = ("task: 'planted_task:Evil' names code to import, which qkvlab runs only from a "
           "module you name: --task-module planted_task (Python: qkvlab.train."
           "allow_task_modules('planted_task')); registered tasks: ")


def test_a_task_a_store_names_is_never_imported(tmp_path, monkeypatch):
    from qkvlab.experiments.store import run_id
    from qkvlab.experiments.worker import work

    ran, spec = planted(tmp_path, monkeypatch)
    db = tmp_path / "r.db"
    with Store(db) as s:  # a store whose ids are honest hashes of specs naming planted code
        (rid,) = s.add("x", "smoke", [(spec, {})])
    assert rid == run_id(spec)
    assert work(str(db), [rid], threads=1) == 1
    with Store(db, readonly=True) as s:
        assert s.status(rid) == "failed" and REFUSED in s.error(rid)
    assert not ran.exists() and "planted_task" not in sys.modules


def test_the_train_entry_imports_a_task_module_only_when_named(tmp_path, monkeypatch, capsys):
    from qkvlab.train.__main__ import main

    ran, spec = planted(tmp_path, monkeypatch)
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(spec))
    assert main([str(path), "--out", str(tmp_path / "out.json")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"qkvlab.train: error: {path}: {REFUSED}")
    assert not ran.exists() and "planted_task" not in sys.modules


def test_a_stored_spec_that_does_not_hash_to_its_id_is_a_damaged_store(tmp_path):
    spec, _ = toy_runs()[0]
    db = tmp_path / "r.db"
    with Store(db) as s:
        (rid,) = s.add("x", "smoke", [(spec, {})])
        s.conn.execute("UPDATE runs SET spec=? WHERE id=?",
                       (json.dumps({**spec, "task": "lm"}), rid))
    with Store(db, readonly=True) as s, pytest.raises(InputFileError) as e:
        s.runs_spec(rid)
    from qkvlab.experiments.store import run_id

    assert str(e.value) == (f"db: {db}: run {rid}: the spec stored under this id hashes to "
                            f"{run_id({**spec, 'task': 'lm'})}; the store is damaged or was "
                            "changed by hand (refused)")


# ---- issue 41: arguments are checked before any work, and no sweep restarts workers forever -----
@pytest.mark.parametrize("extra, said", [
    (["--threads", "-2"], "--threads: -2 must be a positive integer"),
    (["--threads", "0"], "--threads: 0 must be a positive integer"),
    (["--workers", "0"], "--workers: 0 must be a positive integer"),
    (["--device", ""], "--device: '' names no device; use cpu, cuda or cuda:N (or leave "
                       "--device out)")])
def test_sweep_arguments_no_worker_could_use_are_one_line_before_anything(
        tmp_path, capsys, toy, extra, said):
    from qkvlab.cli import main

    db = tmp_path / "r.db"
    assert main(["sweep", toy, "--profile", "smoke", "--db", str(db), "--no-progress",
                 *extra]) == 2
    assert capsys.readouterr().err == f"qkvlab sweep: error: {said}\n"
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(ValueError, match="threads: -2 must be a positive integer"):
        sweep(toy, "smoke", db=db, threads=-2, progress=False)  # the API too
    from qkvlab.train.distributed import use_device

    with pytest.raises(ValueError, match="device: '' names no device"):
        use_device("")


@pytest.mark.parametrize("argv, said", [
    (["study", "--profile", "smoke", "--out", "{file}"], "--out: {file} is a file, where a "
                                                         "folder is expected"),
    (["analyze", "gpt2", "--out", "{file}"], "--out: {file} is a file, where a folder is "
                                             "expected"),
    (["results", "all", "--out", "{dir}"], "--out: {dir} is a folder, where a file is expected"),
    (["results", "all", "--out", "{file}/x.csv"], "--out: {file}/x.csv cannot be made: {file} "
                                                  "is a file, not a folder"),
    (["zoo", "fetch", "all", "--dir", "{file}"], "--dir: {file} is a file, where a folder is "
                                                 "expected"),
    (["study", "--profile", "smoke", "--out", "{dir}/new/report"],
     "--out: {dir}/new/report cannot be written: a file cannot be made in {dir} (Permission "
     "denied)"),
    (["study", "--profile", "smoke", "--out", "/proc/x"],  # root passed os.access here
     "--out: /proc/x cannot be written: a file cannot be made in /proc (No such file or "
     "directory)")])
def test_an_output_that_cannot_be_written_is_refused_before_any_work(tmp_path, capsys,
                                                                     monkeypatch, argv, said):
    from qkvlab.cli import main

    file, folder = tmp_path / "a-file", tmp_path / "ro"
    file.write_text("keep")
    folder.mkdir()
    if "new/report" in argv[-1]:  # tests run as root, whom no mode bit stops: the probe fails
        import tempfile

        from qkvlab import cliargs
        real = tempfile.TemporaryFile

        def denied(*a, dir=None, **k):
            if Path(dir) == folder:
                raise PermissionError(13, "Permission denied")
            return real(*a, dir=dir, **k)
        monkeypatch.setattr(cliargs.tempfile, "TemporaryFile", denied)
    if argv[-1] == "/proc/x" and not Path("/proc/self").is_dir():
        pytest.skip("no /proc here")
    fill = {"file": str(file), "dir": str(folder)}
    db = tmp_path / "r.db"
    with_db = ["--db", str(db)] if argv[0] in ("study", "results") else []
    assert main([a.format(**fill) for a in argv] + with_db) == 2
    command = argv[0]
    assert capsys.readouterr().err == f"qkvlab {command}: error: {said.format(**fill)}\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file", "ro"]
    assert file.read_text() == "keep"


def test_workers_that_keep_dying_end_the_sweep_with_their_cause(tmp_path, toy):
    """A worker that cannot run (here: a thread count torch refuses, as ``--threads -2`` once
    reached it; a full disk alike) was restarted forever; now the sweep stops and says why."""
    from qkvlab.experiments import pool
    from qkvlab.progress import bar

    db = tmp_path / "r.db"
    with Store(db) as s:
        ids = s.add(toy, "smoke", toy_runs())
        with pytest.raises(pool.WorkersDied) as e:
            pool.train_runs(s, ids, ids, "local", 2, -2, bar(total=2, disable=True), None)
        assert [s.status(i) for i in ids] == ["pending", "pending"]
    said = str(e.value)
    assert said.startswith("sweep: every worker process died 3 times in a row without finishing "
                           "a run; last: RuntimeError: set_num_threads expects a positive "
                           "integer (traceback in ")
    saved = Path(said.split("traceback in ")[1].rstrip(")"))
    assert "torch.set_num_threads(threads)" in saved.read_text()
    saved.unlink()


# ---- issue 41: stores: damaged, look-alike, read without a trace, missing ----------------------
def test_a_damaged_store_is_refused_before_anything_writes_to_it(tmp_path):
    db = tmp_path / "d.db"
    spec, _ = toy_runs()[0]
    with Store(db) as s:
        (rid,) = s.add("x", "smoke", [(spec, {})])
        for step in range(300):
            s.log(rid, step, {f"m{i}": float(i) for i in range(10)})
    raw = bytearray(db.read_bytes())
    size = int.from_bytes(raw[16:18], "big")  # the page size; a metrics page near the end
    at = (len(raw) // size - 2) * size
    raw[at + 8:at + size] = b"\xab" * (size - 8)
    db.write_bytes(raw)
    before = digest(db)
    with pytest.raises(InputFileError) as e:
        Store(db)
    assert str(e.value).startswith(f"db: {db} fails SQLite's integrity_check (*** in database main "
                                   "*** On tree page ")
    assert str(e.value).endswith("; the store is damaged, and qkvlab writes nothing to it")
    assert "\n" not in str(e.value) and digest(db) == before


def test_a_runs_table_with_old_column_names_but_no_primary_key_is_not_adopted(tmp_path):
    from qkvlab.experiments.schema import LEGACY_RUNS

    db = tmp_path / "lookalike.db"
    with sqlite3.connect(db) as c:
        c.execute(f"CREATE TABLE runs ({', '.join(sorted(LEGACY_RUNS))})")
        c.execute("INSERT INTO runs (id, spec) VALUES ('a', 'theirs'), ('a', 'again')")
    c.close()
    before = digest(db)
    for readonly in (False, True):
        with pytest.raises(InputFileError, match="is a SQLite database but not a qkvlab results "
                                                 "database .* qkvlab leaves it as it is"):
            Store(db, readonly=readonly)
    assert digest(db) == before and sorted(p.name for p in tmp_path.iterdir()) == [db.name]


def test_results_reads_a_store_and_leaves_nothing_beside_it(tmp_path, capsys, toy):
    from qkvlab.cli import main

    db = tmp_path / "r.db"
    with Store(db) as s:
        ids = s.add(toy, "smoke", toy_runs())
    before = digest(db)
    assert main(["results", toy, "--profile", "smoke", "--db", str(db), "--format", "csv"]) == 0
    rows = capsys.readouterr().out.strip().splitlines()
    assert sorted(r.split(",")[2] for r in rows[1:]) == sorted(ids)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.db"] and digest(db) == before
    missing = tmp_path / "missing.db"
    assert main(["results", toy, "--profile", "smoke", "--db", str(missing)]) == 2
    assert capsys.readouterr().err == (f"qkvlab results: error: db: no results database at "
                                       f"{missing}; run `qkvlab sweep {toy} --profile smoke "
                                       f"--db {missing}`\n")
    assert not missing.exists()
