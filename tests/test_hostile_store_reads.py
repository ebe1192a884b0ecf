"""Issue 41: a damaged store is read, or refused in one line naming it, and a refused store is
left as it was. SQLite's ``quick_check`` passes an index that disagrees with its table; the
damage then surfaced mid-read as ``DatabaseError: database disk image is malformed`` (a
traceback), or was met by the first write of a sweep. Found by the fuzz corpus's store seed
(``fuzz_hostile``), whose reader (``read_store``: what ``results`` reads, then a sweep's open,
spec checks and write) these tests use."""

from __future__ import annotations

import random
import sqlite3
from pathlib import Path

import pytest

import fuzz_hostile
from conftest import toy_runs
from qkvlab.experiments.store import Store
from qkvlab.inputs import InputFileError


@pytest.fixture
def store(tmp_path) -> bytes:
    spec, _ = toy_runs()[0]
    return fuzz_hostile.write_store(tmp_path / "seed.db", spec).read_bytes()


def refused_or_read(path: Path, raw: bytes) -> str:
    path.write_bytes(raw)
    try:
        fuzz_hostile.read_store(path)  # raises RuntimeError if a refused store was changed
        return "read"
    except InputFileError as e:
        said = str(e)
        assert "\n" not in said and str(path) in said, said
        return "refused"
    finally:
        for p in path.parent.glob(path.name + "*"):
            p.unlink()


def test_every_sampled_bit_flip_of_a_store_is_read_or_refused_in_one_line(tmp_path, store):
    """928 flips, one every 53 bytes past the schema page (3.6 s); on 4c7e123 the same sweep
    ended 12 of them in a traceback (11 DatabaseError, 1 JSONDecodeError)."""
    rng = random.Random(0)
    seen = []
    for pos in range(4096, len(store), 53):
        raw = bytearray(store)
        raw[pos] ^= 1 << rng.randrange(8)
        seen.append(refused_or_read(tmp_path / "s.db", bytes(raw)))
    assert len(seen) > 800 and {"read", "refused"} == set(seen)


@pytest.mark.parametrize("sql, said", [
    ("UPDATE measures SET result='{not json'", "measure '{mid}': its result column is not JSON "
                                               "(JSONDecodeError)"),
    ("UPDATE measures SET result='{\"rows\": 1}'", "measure '{mid}': its result is not a list "
                                                   "of records"),
    ("ALTER TABLE runs RENAME COLUMN params TO parameters", "its runs table lacks the columns "
                                                           "['params'] every qkvlab store has"),
    # the slow fuzz corpus's store/flip2680: a flip in the schema page renamed this one
    ("ALTER TABLE metrics RENAME COLUMN run_id TO rid", "its metrics table lacks the columns "
                                                       "['run_id'] every qkvlab store has"),
])
def test_a_store_changed_by_hand_is_one_line_naming_what_changed(tmp_path, store, sql, said):
    db = tmp_path / "s.db"
    db.write_bytes(store)
    with sqlite3.connect(db) as c:
        c.execute(sql)
        (mid,) = c.execute("SELECT id FROM measures").fetchone()
    c.close()
    before = db.read_bytes()
    for readonly in (True, False):
        with pytest.raises(InputFileError) as e:
            with Store(db, readonly=readonly) as s:
                s.measure_rows()
        assert str(e.value).startswith(f"db: {db}") and said.format(mid=mid) in str(e.value)
    if "RENAME" in sql:  # refused before anything was written
        assert db.read_bytes() == before


def test_a_read_command_refuses_a_spec_that_does_not_hash_to_its_id(tmp_path, store, capsys):
    """``results`` showed such a run as done (exit 0); what a reader shows must be what ran."""
    from qkvlab.cli import main

    db = tmp_path / "s.db"
    db.write_bytes(store)
    with sqlite3.connect(db) as c:
        c.execute("UPDATE runs SET spec=json_set(spec, '$.train.steps', 3) WHERE status='done'")
        (rid,) = c.execute("SELECT id FROM runs WHERE status='done'").fetchone()
    c.close()
    assert main(["results", "all", "--db", str(db)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"qkvlab results: error: db: {db}: run {rid}: "
                                                   "the spec stored "
                                                   "under this id hashes to ")

