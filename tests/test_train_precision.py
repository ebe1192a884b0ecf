"""Precision: bf16 falls back to fp32 (warned once) on a CPU without native bf16, bf16_force
insists, and a fallen-back run is exactly the fp32 run. The CPU is forced either way by
monkeypatching the detection; nothing here asserts a timing."""

from __future__ import annotations

import math
import warnings

import pytest
import torch
from test_train_trainer import spec

from qkvlab.experiments.worker import execute
from qkvlab.experiments.store import Store
from qkvlab.train import TrainConfig, precision, run_from_spec
from qkvlab.train.precision import SlowPrecisionWarning, resolve_precision


@pytest.fixture(autouse=True)
def fresh(monkeypatch):
    """Every test starts with no warning given and a fixed probe ratio (no timing)."""
    precision._warn_once.cache_clear()
    monkeypatch.setattr(precision, "bf16_probe", lambda *a, **k: 7.5)
    monkeypatch.setattr(precision, "cpu_capability", lambda: "AVX2")
    yield
    precision._warn_once.cache_clear()


def cpu(monkeypatch, native: bool | None) -> None:
    monkeypatch.setattr(precision, "native_cpu_bf16", lambda: native)


def no_probe(*a, **k):
    raise AssertionError("the probe must not run here")


def test_no_native_bf16_falls_back_to_fp32_and_warns_once(monkeypatch):
    cpu(monkeypatch, False)
    with pytest.warns(SlowPrecisionWarning) as rec:
        used = [resolve_precision("bf16", "cpu") for _ in range(3)]
    assert used == ["fp32"] * 3 and len(rec) == 1
    msg = str(rec[0].message)
    assert "7.5× slower than fp32" in msg and "capability AVX2" in msg
    assert "training in fp32 instead" in msg and "precision='bf16_force'" in msg


def test_bf16_force_keeps_bf16_and_warns_once_that_it_is_slow(monkeypatch):
    cpu(monkeypatch, False)
    with pytest.warns(SlowPrecisionWarning) as rec:
        used = [resolve_precision("bf16_force", "cpu") for _ in range(2)]
    assert used == ["bf16"] * 2 and len(rec) == 1
    msg = str(rec[0].message)
    assert "bf16_force" in msg and "7.5× slower than fp32" in msg and "AVX2" in msg


@pytest.mark.parametrize("requested", ["bf16", "bf16_force"])
def test_native_bf16_that_measures_fast_keeps_bf16_silently(monkeypatch, requested):
    cpu(monkeypatch, True)
    monkeypatch.setattr(precision, "bf16_probe", lambda *a, **k: 0.6)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert resolve_precision(requested, "cpu") == "bf16"


@pytest.mark.parametrize("requested", ["bf16", "bf16_force"])
def test_native_bf16_that_measures_slow_keeps_bf16_and_warns_once(monkeypatch, requested):
    # an Intel Xeon with avx512_bf16 measured 1.6x here: the flags decide, the warning tells
    cpu(monkeypatch, True)
    monkeypatch.setattr(precision, "bf16_probe", lambda *a, **k: 1.6)
    with pytest.warns(SlowPrecisionWarning) as rec:
        used = [resolve_precision(requested, "cpu") for _ in range(3)]
    assert used == ["bf16"] * 3 and len(rec) == 1
    msg = str(rec[0].message)
    assert "1.6× slower than fp32" in msg and "native bf16" in msg and "precision='fp32'" in msg


def test_fp32_is_fp32_everywhere_without_probing(monkeypatch):
    monkeypatch.setattr(precision, "bf16_probe", no_probe)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert resolve_precision("fp32", "cpu") == resolve_precision("fp32", "cuda:1") == "fp32"


@pytest.mark.parametrize("ratio,used", [(1.1, "bf16"), (7.5, "fp32")])
def test_unreadable_flags_decide_by_the_measured_ratio(monkeypatch, ratio, used):
    cpu(monkeypatch, None)
    monkeypatch.setattr(precision, "bf16_probe", lambda *a, **k: ratio)
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        assert resolve_precision("bf16", "cpu") == used
    assert len(rec) == (used == "fp32")


@pytest.mark.parametrize("supported,used", [(True, "bf16"), (False, "fp32")])
def test_cuda_follows_is_bf16_supported(monkeypatch, supported, used):
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: supported)
    monkeypatch.setattr(precision, "bf16_probe", no_probe)
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        assert resolve_precision("bf16", "cuda:0") == resolve_precision("bf16_force", "cuda") == used
    assert len(rec) == (not supported)


def test_unknown_precision_is_rejected_by_name():
    with pytest.raises(ValueError, match=r"train\.precision: 'fp8' is not one of .*'bf16_force'"):
        TrainConfig(precision="fp8")
    with pytest.raises(ValueError, match="precision: 'bf16 ' is not one of"):
        resolve_precision("bf16 ", "cpu")
    with pytest.raises(ValueError, match="precision_used"):
        precision.autocast("bf16_force", "cpu")
    assert TrainConfig(precision="bf16_force").precision == "bf16_force"


def test_fallen_back_run_is_exactly_the_fp32_run_and_records_it(monkeypatch):
    cpu(monkeypatch, False)
    fp32 = run_from_spec(spec(seed=5), progress=False)
    with pytest.warns(SlowPrecisionWarning, match="training in fp32 instead"):
        fell = run_from_spec(spec(seed=5, precision="bf16"), progress=False)
    assert (fp32.precision_used, fell.precision_used) == ("fp32", "fp32")
    assert fell.history == fp32.history and fell.final == fp32.final  # every float equal
    assert fell.to_dict()["precision_used"] == "fp32"


def test_bf16_force_trains_in_bf16(monkeypatch):
    cpu(monkeypatch, False)
    with pytest.warns(SlowPrecisionWarning, match="bf16_force"):
        forced = run_from_spec(spec(seed=5, steps=2, eval_every=0, precision="bf16_force"),
                               progress=False)
    assert forced.status == "done" and forced.precision_used == "bf16"


def test_runner_stores_precision_used_in_the_hardware_json(monkeypatch, tmp_path):
    cpu(monkeypatch, False)
    run = spec(seed=1, steps=2, eval_every=0, precision="bf16")
    with pytest.warns(SlowPrecisionWarning):
        out = execute(run, tmp_path / "run")
    assert out["info"]["precision_used"] == out["info"]["hardware"]["precision_used"] == "fp32"
    with Store(tmp_path / "r.db") as s:
        rid, = s.add("exp", "quick", [(run, {"design": "standard"})])
        assert s.claim(rid)
        s.finish(rid, out["status"], out["step"], out["final"], out["info"])
        row, = s.runs("exp")
    assert row["hardware"]["precision_used"] == "fp32" and row["hardware"]["cpu_count"]


def test_probe_is_a_positive_ratio_and_leaves_torch_state_alone(monkeypatch):
    monkeypatch.undo()  # the real probe, uncached
    probe = precision.bf16_probe.__wrapped__
    threads, rng = torch.get_num_threads(), torch.get_rng_state()
    with torch.no_grad():
        r = probe(n=32, reps=1)
    assert math.isfinite(r) and r > 0
    assert torch.get_num_threads() == threads and torch.equal(torch.get_rng_state(), rng)
    with pytest.raises(ValueError, match="n=2"):
        probe(n=2)


def test_cpu_flags_name_the_native_bf16_instructions():
    flags = precision.cpu_flags()
    if flags is None:
        pytest.skip("no /proc/cpuinfo")
    assert precision.native_cpu_bf16() == bool(flags & {"avx512_bf16", "amx_bf16", "bf16"})
    report = precision.cpu_bf16_report(reps=1)
    assert report["native_bf16"] == bool(report["bf16_flags"])
    assert report["cpu_capability"] == "AVX2"  # the fixture's
