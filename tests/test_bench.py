"""The benchmark code paths run and report sane, internally consistent values (not timed)."""

from __future__ import annotations

import pytest

from qkvlab import bench
from qkvlab.cli import bench_tables


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
