"""Issue #41, continued, one test per finding: GGUF special token ids outside the vocabulary
(1) and tensors whose data overlap (2) are refused by the header walk; an empty ``--db`` file is
refused by every command (3); ``results --stats`` names only metrics it knows (4)."""

from __future__ import annotations

import pytest

import fuzz_formats
from qkvlab.analysis import resolve
from qkvlab.inputs import InputFileError


# ---- 1: a token id past the vocabulary was an IndexError ----------------------------------------
@pytest.mark.parametrize("key, kind, value", [("bos_token_id", 4, 12), ("eos_token_id", 4, 70000),
                                              ("eos_token_id", 5, -1)])
def test_a_special_token_id_outside_the_vocabulary_is_refused(tmp_path, key, kind, value):
    meta, tensors = fuzz_formats.gguf_seed()  # 12 tokens
    meta = [*meta, (f"tokenizer.ggml.{key}", kind, value)]
    path = tmp_path / "m.gguf"
    path.write_bytes(fuzz_formats.gguf_bytes(meta, tensors))
    with pytest.raises(InputFileError) as e:
        resolve(str(path))
    assert str(e.value) == (f"{path}: tokenizer.ggml.{key} = {value} is not a token id: the "
                            "vocabulary (tokenizer.ggml.tokens) holds 12 tokens (ids 0 to 11)")


def test_special_token_ids_inside_the_vocabulary_load(tmp_path):
    meta, tensors = fuzz_formats.gguf_seed()
    meta = [*meta, ("tokenizer.ggml.bos_token_id", 4, 0), ("tokenizer.ggml.eos_token_id", 4, 11)]
    path = tmp_path / "m.gguf"
    path.write_bytes(fuzz_formats.gguf_bytes(meta, tensors))
    assert resolve(str(path)) is not None


# ---- 2: tensors sharing bytes were analysed -----------------------------------------------------
def test_tensors_whose_data_overlap_are_refused_naming_both(tmp_path):
    meta, tensors = fuzz_formats.gguf_seed()  # token_embd.weight: 384 bytes at offset 0
    path = tmp_path / "m.gguf"
    path.write_bytes(fuzz_formats.gguf_bytes(meta, tensors,
                                             infos={"blk.0.attn_q.weight": {"offset": 352}}))
    with pytest.raises(InputFileError) as e:
        resolve(str(path))
    assert str(e.value) == (f"{path}: the data of GGUF tensor 'blk.0.attn_q.weight' (256 bytes at "
                            "offset 352) overlaps that of tensor 'token_embd.weight' (384 bytes "
                            "at offset 0)")


# ---- 3: an empty --db was refused by sweep, adopted by study and tiecost ----------------------------
def test_an_empty_db_file_is_refused_by_every_command_in_the_same_line(tmp_path, capsys):
    from conftest import temporary_experiment, toy_runs
    from qkvlab.cli import main
    from qkvlab.experiments.store import Store

    db = tmp_path / "empty.db"
    db.touch()
    with temporary_experiment("toy_empty_db", toy_runs()) as toy:
        for argv in (["sweep", toy, "--profile", "smoke", "--no-progress"],
                     ["study", "--profile", "smoke", "--no-progress", "--out", str(tmp_path)],
                     ["tiecost", "no/such-model"], ["results", "all"]):
            assert main([*argv, "--db", str(db)]) == 2, argv
            err = capsys.readouterr().err.strip().splitlines()
            assert err == [f"qkvlab {argv[0]}: error: db: {db} is empty, not a results "
                           "database"], argv
    for readonly in (False, True):
        with pytest.raises(InputFileError):
            Store(db, readonly=readonly)
    assert db.stat().st_size == 0 and sorted(tmp_path.iterdir()) == [db]
    with Store(tmp_path / "new.db") as store:  # a path that names nothing is a new store
        assert store.runs(None, None) == []


# ---- 4: `results --stats nosuch` printed a table of NaNs ------------------------------------------
def test_results_stats_refuses_a_metric_no_run_records_listing_those_they_do(tmp_path, capsys):
    from conftest import toy_runs
    from qkvlab.cli import main
    from qkvlab.experiments.store import Store

    db = tmp_path / "r.db"
    with Store(db) as s:
        for rid in s.add("toy", "smoke", toy_runs()):
            s.finish(rid, "done", 12, {"val_loss": 1.5, "accuracy": 0.25}, {"n_params": 100})
    assert main(["results", "all", "--db", str(db), "--stats", "nosuch"]) == 2
    assert capsys.readouterr().err == ("qkvlab results: error: --stats: unknown metric 'nosuch'; the runs shown "
                                       "record: accuracy, val_loss\n")
    assert main(["results", "all", "--db", str(db), "--stats", "val_loss"]) == 0
    out = capsys.readouterr().out  # one seed each: a mean, no interval
    assert out.count("val_loss 1.5 ± nan (n=1, params 100)") == 2


def test_a_bad_argument_is_one_line_naming_the_help(capsys):
    """argparse printed its usage block first: nine lines for ``convert --threads 0``."""
    from qkvlab.cli import main

    with pytest.raises(SystemExit) as e:
        main(["convert", "smollm2", "--threads", "0"])
    assert e.value.code == 2
    assert capsys.readouterr().err == ("qkvlab convert: error: argument --threads: '0' is not a "
                                       "positive integer (see qkvlab convert --help)\n")
