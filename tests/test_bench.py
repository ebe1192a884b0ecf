"""The benchmark code paths run and report sane, internally consistent values (not timed)."""

from __future__ import annotations

import pytest
import torch

from qkvlab import bench
from qkvlab.cli import bench_tables
from qkvlab.train import precision


def test_fold_alt_benchmark_reports_exact_fold():
    r = bench.bench_fold_alt("small", train_steps=3, rounds=1, log=lambda m: None)
    assert r["max_abs_diff_fp32"] <= 1e-5 and r["max_abs_diff_fp64"] <= 1e-12
    assert r["params_alt"] - r["params_folded"] == 4 * 4 * 32 * 32  # layers * heads * d_v²
    assert r["train_loss_last"] < r["train_loss_first"]


def test_projection_flops_order_follows_tying():
    res = {}
    for d in ("standard", "alt", "tied_qk", "tied_kv", "tied_qkv"):
        cfg = bench.AttentionConfig(d_model=64, n_heads=4, design=d)
        res[d] = bench.projection_flops(cfg, 2, 16)
    assert res["tied_qkv"] < res["tied_qk"] == res["tied_kv"] < res["standard"] < res["alt"]


def test_cache_bytes_table_halves_for_tied_kv():
    t = bench.cache_bytes_table("small")
    assert t["tied_kv"] * 2 == t["standard"] == t["tied_qk"] == t["alt"]
    assert t["tied_qkv"] == t["tied_kv"] == t["standard GQA G=2"]
    assert t["standard"] == 4 * 2 * 128 * 4  # layers * (k, v) * d_model * fp32 bytes


@pytest.mark.slow
def test_training_benchmark_runs_against_peers():
    r = bench.bench_training("small", steps=1, rounds=1, log=lambda m: None)
    assert set(r) == {"qkvlab", "qkvlab_bf16", "hf_gpt2", "x_transformers", "bf16_loss_gap"}
    assert "Training tokens/s" in bench_tables({"training": {"small": r}})


def test_bench_tables_open_with_the_cpu_and_its_bf16_cost():
    cpu = {"cpu_model": "AMD EPYC", "cpu_capability": "AVX2", "native_bf16": False,
           "bf16_flags": [], "bf16_fp32_ratio": 6.25, "probe": "MLP block"}
    training = {"small": {"qkvlab": 1000.0, "qkvlab_bf16": 80.0, "bf16_loss_gap": 1e-3}}
    text = bench_tables({"cpu": cpu, "training": training})
    assert text.startswith("CPU and bf16 autocast")
    assert "| AMD EPYC | AVX2 | no | 6.25 | 12.50 |" in text  # probe, then 1000 / 80
    assert text.index("CPU and bf16") < text.index("Training tokens/s")


def test_cpu_bf16_report_has_capability_native_flag_and_a_ratio(monkeypatch):
    monkeypatch.setattr(precision, "bf16_probe", lambda *a, **k: 3.0)
    r = precision.cpu_bf16_report(reps=1)
    assert r["cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    assert r["native_bf16"] in (True, False, None) and r["bf16_fp32_ratio"] == 3.0
