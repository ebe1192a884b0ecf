"""Atomic writes: the mode a normal open() gives, the old file kept on errors, no temp files
left behind, and concurrent writers of one path each leaving a complete file."""

from __future__ import annotations

import json
import multiprocessing
import os
import stat
import threading

import pytest

from qkvlab.fileio import atomic_open, atomic_write, atomic_write_bytes, atomic_write_text


@pytest.fixture
def umask022():
    old = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(old)


def _mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_new_files_get_the_mode_open_would_give(tmp_path, umask022):
    plain = tmp_path / "plain.txt"
    plain.write_text("x")
    for name, write in (("a.txt", lambda p: atomic_write_text(p, "hello")),
                        ("b.bin", lambda p: atomic_write_bytes(p, b"\0\1")),
                        ("c.json", lambda p: atomic_write(p, lambda t: t.write_text("{}")))):
        write(tmp_path / name)
        assert _mode(tmp_path / name) == _mode(plain) == 0o644, name
    with atomic_open(tmp_path / "d.json") as f:
        json.dump({"a": 1}, f)
    assert _mode(tmp_path / "d.json") == 0o644 and json.loads((tmp_path / "d.json").read_text()) == {"a": 1}
    os.umask(0o077)
    atomic_write_text(tmp_path / "private.txt", "s")
    assert _mode(tmp_path / "private.txt") == 0o600


def test_cli_and_analysis_json_outputs_are_0644(tmp_path, umask022):
    from qkvlab.analysis.run import _atomic_json
    from qkvlab.bench.cli import _write_json

    _write_json(tmp_path / "bench.json", {"a": 1})
    _atomic_json(tmp_path / "measures.json", {"a": float("nan")})
    assert _mode(tmp_path / "bench.json") == _mode(tmp_path / "measures.json") == 0o644


def test_old_file_survives_an_error_and_no_temp_file_is_left(tmp_path):
    path = tmp_path / "out.txt"
    atomic_write_text(path, "old")

    def half_then_fail(tmp):
        tmp.write_text("half")
        raise RuntimeError("writer failed")

    with pytest.raises(RuntimeError, match="writer failed"):
        atomic_write(path, half_then_fail)
    with pytest.raises(KeyError):
        with atomic_open(path, "w") as f:
            f.write("partial")
            raise KeyError("inside the block")
    assert path.read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.txt"]


def test_parent_is_created_and_bad_modes_are_refused(tmp_path):
    atomic_write_text(tmp_path / "a" / "b" / "c.txt", "deep")
    assert (tmp_path / "a" / "b" / "c.txt").read_text() == "deep"
    with pytest.raises(ValueError, match="mode"):
        with atomic_open(tmp_path / "x.txt", "a"):
            pass
    assert not (tmp_path / "x.txt").exists()


def _write_many(path: str, tag: str, rounds: int) -> None:
    for i in range(rounds):
        atomic_write_text(path, json.dumps({"tag": tag, "i": i, "pad": tag * 200_000}))


def _complete(path) -> dict:
    data = json.loads(path.read_text())  # a torn or interleaved file would not parse
    assert data["pad"] == data["tag"] * 200_000
    return data


def test_concurrent_writers_of_one_path_leave_a_complete_file(tmp_path):
    path = tmp_path / "shared.json"
    threads = [threading.Thread(target=_write_many, args=(str(path), t, 10)) for t in "ab"]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert _complete(path)["i"] == 9
    ctx = multiprocessing.get_context("fork" if hasattr(os, "fork") else "spawn")
    procs = [ctx.Process(target=_write_many, args=(str(path), t, 10)) for t in "cd"]
    for p in procs:
        p.start()
    while any(p.is_alive() for p in procs):
        if path.exists():
            _complete(path)  # readers see an old or a new file, never half of one
    assert all(p.join() is None and p.exitcode == 0 for p in procs)
    assert _complete(path)["tag"] in "cd"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["shared.json"]
