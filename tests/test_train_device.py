"""Where a sweep's runs train: ``QKVLAB_DEVICE``, else a GPU where PyTorch sees one, else the
CPU; a bad value is one clear error and changes nothing."""

from __future__ import annotations

import pytest
import torch

from qkvlab.cli import main
from qkvlab.experiments.worker import execute
from qkvlab.train.distributed import DEVICE_ENV, default_device, use_device


def test_the_default_is_a_gpu_where_there_is_one(monkeypatch):
    monkeypatch.delenv(DEVICE_ENV, raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert default_device() == "cuda"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert default_device() == "cpu"


@pytest.mark.parametrize("value", ["gpu", "cpu:0", "cuda:x", "tpu"])
def test_a_value_that_is_no_device_is_refused_and_the_environment_kept(monkeypatch, value):
    monkeypatch.setenv(DEVICE_ENV, "cpu")
    with pytest.raises(ValueError, match=f"{DEVICE_ENV}={value!r}: not a device"):
        use_device(value)
    assert default_device() == "cpu"


def test_cuda_where_pytorch_sees_no_gpu_is_refused(monkeypatch):
    monkeypatch.delenv(DEVICE_ENV, raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ValueError, match="PyTorch sees no GPU here"):
        use_device("cuda:1")
    assert DEVICE_ENV not in __import__("os").environ


def test_a_run_trains_on_the_chosen_device_and_the_store_records_it(monkeypatch, tmp_path):
    monkeypatch.setenv(DEVICE_ENV, "cpu")
    from conftest import toy_runs
    spec, _ = toy_runs()[0]
    out = execute(spec, tmp_path / "run", progress=False)
    assert out["status"] == "done"
    assert out["info"]["hardware"]["device"] == "cpu"


def test_the_cli_refuses_a_device_it_cannot_use_before_anything_runs(monkeypatch, tmp_path,
                                                                        capsys):
    monkeypatch.delenv(DEVICE_ENV, raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    db = tmp_path / "r.db"
    assert main(["sweep", "scale_probe", "--profile", "smoke", "--db", str(db),
                 "--device", "cuda"]) == 2
    assert "PyTorch sees no GPU here" in capsys.readouterr().err
    assert not db.exists()
