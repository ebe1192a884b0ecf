"""The benchmark code paths run and report sane, internally consistent values (not timed)."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch

from qkvlab.attention import AttentionConfig
from qkvlab.bench import decode, designs, peers, training, workload
from qkvlab.bench.run import check_device, default_device, measure_bf16
from qkvlab.bench.tables import bench_tables
from qkvlab.kernels import gemv, linear
from qkvlab.models import speed
from qkvlab.timing import ratio_stats
from qkvlab.train import precision


def test_fold_alt_benchmark_reports_exact_fold():
    r = designs.bench_fold_alt("small", train_steps=3, rounds=1, log=lambda m: None)
    assert r["max_abs_diff_fp32"] <= 1e-5 and r["max_abs_diff_fp64"] <= 1e-12
    assert r["params_alt"] - r["params_folded"] == 4 * 4 * 32 * 32  # layers * heads * d_v²
    assert r["train_loss_last"] < r["train_loss_first"]


def test_projection_flops_order_follows_tying():
    res = {}
    for d in ("standard", "alt", "tied_qk", "tied_kv", "tied_qkv"):
        cfg = AttentionConfig(d_model=64, n_heads=4, design=d)
        res[d] = speed.projection_flops(cfg, 2, 16)
    assert res["tied_qkv"] < res["tied_qk"] == res["tied_kv"] < res["standard"] < res["alt"]


def test_cache_bytes_table_halves_for_tied_kv():
    t = designs.cache_bytes_table("small")
    assert t["tied_kv"] * 2 == t["standard"] == t["tied_qk"] == t["alt"]
    assert t["tied_qkv"] == t["tied_kv"] == t["standard GQA G=2"]
    assert t["standard"] == 4 * 2 * 128 * 4  # layers * (k, v) * d_model * fp32 bytes


NANOGPT = Path(__file__).parent / "fixtures" / "nanogpt"


@pytest.mark.slow
def test_training_benchmark_runs_against_peers():
    r = training.bench_training("small", steps=1, rounds=1, log=lambda m: None)
    assert set(r["vs_peer"]) == {"hf_gpt2", "x_transformers", "litgpt"}
    assert {"qkvlab", "qkvlab_bf16", "hf_gpt2", "x_transformers", "litgpt", "bf16_loss_gap"} <= set(r)
    assert r["vs_peer"]["hf_gpt2"]["qkvlab"] == "qkvlab"  # GPT-2's settings are qkvlab's defaults
    assert "Training tokens/s" in bench_tables({"training": {"small": r}})


def test_training_benchmark_runs_nanogpt_from_a_checkout_with_and_without_biases():
    r = training.bench_training("small", steps=1, rounds=2, peers=(), nanogpt=NANOGPT,
                                bf16=False, log=lambda m: None)
    assert set(r["vs_peer"]) == {"nanogpt", "nanogpt_bias"}
    assert r["vs_peer"]["nanogpt"]["qkvlab"] == "qkvlab[activation=gelu,bias=False]"
    assert r["vs_peer"]["nanogpt_bias"]["qkvlab"] == "qkvlab[activation=gelu,bias=True]"
    for v in r["vs_peer"].values():
        assert 0 < v["min"] <= v["ratio"] <= v["max"]
    text = bench_tables({"training": {"small": r}})
    assert "| small | nanogpt | no biases, exact GELU |" in text


def test_nanogpt_path_errors_name_what_is_missing(tmp_path):
    with pytest.raises(ValueError, match="no model.py"):
        peers.load_nanogpt(tmp_path)
    (tmp_path / "model.py").write_text("class GPTConfig:\n    pass\n")
    with pytest.raises(ValueError, match="defines no GPT"):
        peers.load_nanogpt(tmp_path)
    with pytest.raises(ValueError, match="unknown"):
        peers.builders(["nanogpt"])  # nanoGPT only comes from a path


def test_bench_cli_refuses_a_nanogpt_path_without_model_py(tmp_path, capsys):
    from qkvlab.cli import main

    assert main(["bench", "--nanogpt", str(tmp_path), "--out", str(tmp_path / "b.json")]) == 2
    assert "no model.py" in capsys.readouterr().err


def test_peer_builders_match_their_qkvlab_settings():
    s = workload.SIZES["small"]
    loss, model = peers.nanogpt(peers.load_nanogpt(NANOGPT), bias=False)(s, workload.VOCAB)
    assert all("bias" not in n for n, _ in model.named_parameters())
    x, y = workload.train_batches(s, 1)[0]
    assert loss(x, y).shape == ()
    ours = workload.qkvlab_lm(s, **peers.MATCHED["nanogpt"])
    assert all("bias" not in n and "b_in" not in n for n, _ in ours.named_parameters())


def test_ratio_stats_are_per_round():
    r = ratio_stats([2.0, 3.0, 8.0], [1.0, 3.0, 2.0])
    assert (r["ratio"], r["min"], r["max"]) == (2.0, 1.0, 4.0)
    assert r["gmean"] == pytest.approx(2.0)  # (2 · 1 · 4)^(1/3)


def test_ratio_verdict_is_a_paired_t_test_on_log_ratios():
    from scipy import stats

    ratios = [1.30, 1.22, 1.41, 1.18, 1.35]
    r = ratio_stats(ratios, [1.0] * len(ratios))
    logs = np.log(ratios)
    lo, hi = stats.t.interval(0.95, len(logs) - 1, loc=logs.mean(), scale=stats.sem(logs))
    assert (r["ci_lo"], r["ci_hi"]) == pytest.approx((np.exp(lo), np.exp(hi)))
    assert r["verdict"] == "faster"
    assert ratio_stats([1 / x for x in ratios], [1.0] * 5)["verdict"] == "slower"
    level = ratio_stats([1.01, 0.99, 1.00, 1.02, 0.995, 1.005], [1.0] * 6)
    assert level["verdict"] == "level" and level["rounds_needed"] is None
    noisy = ratio_stats([1.10, 0.90, 1.15, 0.88, 1.02], [1.0] * 5)
    assert noisy["verdict"] == "undecided" and noisy["rounds_needed"] > 5
    one = ratio_stats([1.1], [1.0])
    assert one["verdict"] == "undecided" and one["ci_lo"] is None


def test_decode_bound_counts_each_weight_once():
    model = workload.qkvlab_lm(workload.SIZES["small"])
    n = sum(p.numel() for p in model.parameters())  # the tied embedding counted once
    rows = model.embed.wpe.weight.shape[0]
    assert decode.weight_bytes_per_token(model) == 4 * (n - (rows - 1) * model.cfg.d_model)
    assert decode.copy_bandwidth(mbytes=8, reps=1) > 0


def test_decode_gemvs_are_every_weight_but_norms_and_positions():
    model = workload.qkvlab_lm(workload.SIZES["small"])
    mats = gemv.matrices(model)
    got = sum(w.nbytes + (0 if b is None else b.nbytes) for w, b in mats)
    norms = sum(p.nbytes for m in model.modules() if isinstance(m, torch.nn.LayerNorm)
                for p in m.parameters())
    row = model.embed.wpe.weight[0].nbytes
    assert got == decode.weight_bytes_per_token(model) - norms - row
    assert 0 < decode.gemv_seconds_per_token(model, reps=1) < 1
    assert 0 < decode.gemv_seconds_per_token(model, reps=1, fn=linear) < 1


def test_decode_bench_gives_both_gemv_floors_and_the_kernel_decoding_chose():
    pytest.importorskip("transformers")
    r = decode.bench_decode("small", new_tokens=4, rounds=1, log=lambda *a: None)
    assert r["qkvlab"] > 0 and r["hf_generate"] > 0 and r["max_logit_diff"] < 1e-4
    assert r["gemv_kernel"] in ("linear", "batched") and r["gemv_probe"] > 0
    assert r["gemv_tokens_per_s"] > 0 and r["gemv_ours_tokens_per_s"] > 0


def test_bench_tables_open_with_the_cpu_and_its_bf16_cost():
    cpu = {"cpu_model": "AMD EPYC", "cpu_capability": "AVX2", "native_bf16": False,
           "bf16_flags": [], "bf16_fp32_ratio": 6.25, "probe": "MLP block"}
    training = {"small": {"qkvlab": 1000.0, "qkvlab_bf16": 80.0, "bf16_loss_gap": 1e-3, "vs_peer": {}}}
    text = bench_tables({"cpu": cpu, "training": training})
    assert text.startswith("CPU and bf16 autocast")
    assert "| AMD EPYC | AVX2 | no | 6.25 | 12.50 |" in text  # probe, then 1000 / 80
    assert text.index("CPU and bf16") < text.index("Training tokens/s")


def test_cpu_bf16_report_has_capability_native_flag_and_a_ratio(monkeypatch):
    monkeypatch.setattr(precision, "bf16_probe", lambda *a, **k: 3.0)
    r = precision.cpu_bf16_report(reps=1)
    assert r["cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    assert r["native_bf16"] in (True, False, None) and r["bf16_fp32_ratio"] == 3.0


def test_bench_trains_large_in_bf16_only_where_the_cpu_may_have_it():
    assert measure_bf16("small", {"native_bf16": False})
    assert not measure_bf16("large", {"native_bf16": False})
    assert measure_bf16("large", {"native_bf16": True})
    assert measure_bf16("large", {"native_bf16": None})  # unknown: measure it
    cpu = {"cpu_model": "AMD EPYC", "cpu_capability": "AVX2", "native_bf16": False,
           "bf16_flags": [], "bf16_fp32_ratio": 6.25, "probe": "MLP block"}
    training = {"small": {"qkvlab": 1000.0, "qkvlab_bf16": 80.0, "bf16_loss_gap": 1e-3, "vs_peer": {}},
                "large": {"qkvlab": 100.0, "vs_peer": {}}}
    text = bench_tables({"cpu": cpu, "training": training})
    assert "training large" not in text and "not measured at the large size" in text


def test_decode_table_gives_the_ratio_a_gemv_only_decoder_would_reach():
    decode = {"large": {"qkvlab": 200.0, "hf_generate": 160.0, "ratio": 1.25, "min": 1.2, "max": 1.3,
                        "bound_tokens_per_s": 600.0, "gemv_tokens_per_s": 280.0,
                        "weight_mb_per_token": 42.7, "bandwidth_gb_s": 25.0, "max_logit_diff": 1e-6,
                        "gemv_kernel": "batched", "gemv_probe": 2.2, "gemv_ours_tokens_per_s": 700.0}}
    text = bench_tables({"decode": decode})
    # 280 / 160 at F.linear's floor; the kernel qkvlab chose, its probe ratio and its own floor
    assert "| large | 200 | 160 | 1.25 | 1.20-1.30 | 600 | 280 | 1.75 | batched (2.20x) | 700 |" in text


def test_default_model_table_keeps_its_columns_when_one_size_has_no_bf16():
    compiled = {"compiled": {"ratio": 0.9, "min": 0.8, "max": 1.0}, "compile_s": 30.0}
    training = {"small": {"qkvlab": 1000.0, "qkvlab_bf16": 80.0, "bf16_loss_gap": 1e-3,
                          "vs_peer": {}, **compiled},
                "large": {"qkvlab": 100.0, "vs_peer": {}, **compiled}}
    text = bench_tables({"training": training})
    assert "| small | 1,000 | 80 | 0.001 | 0.90 | 0.80-1.00 | 30.00 |" in text
    assert "| large | 100 | not measured |  | 0.90 | 0.80-1.00 | 30.00 |" in text


def test_training_table_gives_each_ratio_its_ci_and_verdict():
    vs = ratio_stats([1.30, 1.22, 1.41, 1.18, 1.35], [1.0] * 5)
    noisy = ratio_stats([1.10, 0.90, 1.15, 0.88, 1.02], [1.0] * 5)
    training = {"small": {"qkvlab": 1000.0, "qkvlab[x]": 900.0, "hf_gpt2": 700.0, "nanogpt": 950.0,
                          "vs_peer": {"hf_gpt2": {"qkvlab": "qkvlab", **vs},
                                      "nanogpt": {"qkvlab": "qkvlab[x]", **noisy}}}}
    text = bench_tables({"training": training})
    assert f"| {vs['ci_lo']:.2f}-{vs['ci_hi']:.2f} | faster |" in text
    assert f"| undecided · n≈{noisy['rounds_needed']} rounds |" in text


def test_bench_device_errors_name_what_is_wrong(monkeypatch):
    assert check_device("cpu") == "cpu"
    with pytest.raises(ValueError, match="not a torch device"):
        check_device("gpu0")
    with pytest.raises(ValueError, match="runs on cpu or cuda"):
        check_device("meta")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ValueError, match="no CUDA device here"):
        check_device("cuda")
    assert default_device() == "cpu"


def test_bench_cli_refuses_cuda_where_there_is_none(tmp_path, capsys, monkeypatch):
    from qkvlab.cli import main

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert main(["bench", "--device", "cuda", "--out", str(tmp_path / "b.json")]) == 2
    assert "no CUDA device here" in capsys.readouterr().err
    assert not (tmp_path / "b.json").exists()


def test_bench_parts_take_an_explicit_device():
    """The CUDA path is the CPU path with the device passed through and a sync around each
    timer (a GPU test needs a GPU: see DEVELOPERS.md); on the CPU every part runs as before."""
    s = workload.SIZES["small"]
    model = workload.qkvlab_lm(s)
    run, losses = training._train_rate(workload.lm_loss(model), model, s, 1, bf16=False,
                                       device="cpu")
    assert run() > 0 and len(losses) == 1
    r = speed.attention_layer_speed(32, 2, 8, 1, {"tied_kv": {"design": "tied_kv"}}, iters=1,
                                    rounds=1, device="cpu")
    assert r["standard"]["time_vs_standard"] == 1.0 and r["tied_kv"]["params_vs_standard"] < 1
    assert decode.copy_bandwidth(mbytes=1, reps=1, device="cpu") > 0


def test_gpu_table_holds_the_gpu_and_the_cpu_table_only_the_cpu():
    cpu = {"cpu_model": "AMD EPYC", "cpu_capability": "AVX2", "native_bf16": False,
           "bf16_flags": [], "bf16_fp32_ratio": 6.25, "probe": "MLP block"}
    gpu = {"gpu": "NVIDIA H100", "capability": "9.0", "bf16": True, "cuda": "12.8"}
    training = {"small": {"qkvlab": 1000.0, "qkvlab_bf16": 2000.0, "bf16_loss_gap": 1e-3,
                          "vs_peer": {}}}
    text = bench_tables({"cpu": cpu, "gpu": gpu, "device": "cuda", "training": training})
    assert "| AMD EPYC | AVX2 | no | 6.25 |\n" in text  # no GPU training ratio under the CPU
    assert "| cuda | NVIDIA H100 | 9.0 | yes | 12.8 | 0.50 |" in text
    assert text.index("CPU and bf16") < text.index("GPU:") < text.index("Training tokens/s")
    assert measure_bf16("large", cpu, "cuda") and not measure_bf16("large", cpu, "cpu")


def test_kv_decode_rows_hold_every_layout_with_consistent_bytes_and_bounds(tmp_path):
    from qkvlab.bench import kv
    from qkvlab.kernels import attend as kattend
    from qkvlab.models.speed import kv_decode_speed

    rows = kv_decode_speed((8, 512), (1, 4), d_model=32, n_heads=4, rounds=1,  # 512 x 4: targets
                           rotary=True)
    assert len(rows) == 8 * 4
    assert {r["baseline"] for r in rows if r["design"].startswith("rotary_")} == {
        "rotary_standard"}
    assert {r["baseline"] for r in rows if not r["design"].startswith("rotary_")} == {"standard"}
    for (T, B) in [(8, 1), (8, 4), (512, 1), (512, 4)]:
        at = {r["design"]: r for r in rows if (r["context"], r["batch"]) == (T, B)}
        std = at["standard"]
        assert std["ratio"] == 1.0 and std["cache_bytes"] == 2 * B * T * 4 * 8 * 4
        assert at["tied_kv"]["cache_bytes"] == at["gqa_2"]["cache_bytes"] == std["cache_bytes"] // 2
        assert at["mqa"]["cache_bytes"] == std["cache_bytes"] // 4
        rot = at["rotary_standard"]
        assert rot["ratio"] == 1.0 and rot["cache_bytes"] == std["cache_bytes"]
        assert at["rotary_tied_kv"]["cache_bytes"] == std["cache_bytes"] // 2
        # rotary K=V is measured against SDPA where it may choose; its steps rotate per block
        assert at["rotary_tied_kv"]["kernel"] in ("sdpa", "blocked")
        for r in at.values():
            assert r["kernel"] in ("sdpa", "blocked") and r["tokens_per_s"] > 0
            assert r["bound_tokens_per_s"] == pytest.approx(
                B * r["copy_gb_s"] * 1e9 / (r["cache_bytes"] + r["weight_bytes"]))
            assert 0 < r["attention_cache_gb_s"] < math.inf
            assert 0 < r["cache_read_gb_s"] < math.inf  # a plain sum of the same tensors
            assert "products_gb_s" not in r  # neither kernel has GEMMs of its own
        # one head per kv head (standard, K=V) without rotary keys: the kernel is SDPA itself
        # only where Numba does not import (then it is not measured); else it is measured too
        if not kattend._numba_imports():
            for d in ("standard", "tied_kv", "tied_qkv", "rotary_standard"):
                assert at[d]["kernel"] == "sdpa"
    targets = kv.targets(rows)
    assert len(targets) == 6  # n_heads 4: no gqa_4 (its H/4 is gqa_1); the choice's last
    assert [t["what"] for t in targets][3] == "rotary_tied_kv / rotary_standard tokens/s"
    assert targets[-1]["what"].startswith("worst layout on its kernel / on SDPA")
    for t in targets[:-1]:
        assert t["products_bound"] is None
        assert (t["bounded_by"].startswith(("memory", "the attention's work per token"))
                if not t["met"] else t["bounded_by"] == "")
    assert [t["target"] for t in kv.targets(rows, "cuda")][:4] == [1.8, 3.0, 5.0, 1.6]
    assert [t["target"] for t in targets][:4] == [1.8, 3.0, 4.0, 1.6]
    text = bench_tables({"kv_decode": {"rows": rows, "targets": targets}})
    assert "When does K = V pay?" in text and "| memory bound | bounded by |" in text
    assert "| attention GB/s | read GB/s |" in text
    assert "products" not in text
    assert kv.kv_figure(rows, tmp_path / "kv.png").stat().st_size > 0


def test_kv_targets_are_read_where_the_cache_dominates():
    from qkvlab.bench import kv

    def row(T, design, ratio, share):
        return {"context": T, "batch": 4, "design": design, "ratio": ratio, "cache_share": share,
                "bound_tokens_per_s": 10.0 * ratio, "attention_cache_gb_s": 8.0,
                "copy_gb_s": 10.0, "products_gb_s": 6.0 if design == "mqa" else 9.0,
                "products_bound_tokens_per_s": (4.0 if design == "mqa" else 10.0) * ratio,
                "kernel": "sdpa" if design == "standard" else "blocked",
                "own_sdpa": 0.9 if (T, design) == (512, "gqa_2") else 0.97}

    rows = [row(T, d, r, s) for T, s in [(512, 0.5), (4096, 0.9), (8192, 0.95)]
            for d, r in [("standard", 1.0), ("tied_kv", 1.9), ("gqa_4", 1.5), ("gqa_2", 3.2),
                         ("mqa", 4.0)]]
    rows = [r for r in rows if not (r["context"] == 8192 and r["design"] == "standard")] + [
        row(8192, "standard", 1.0, 0.7)]  # 8192's standard cache share is below 80%
    # records of the old kernel (its products' floor), read against the GPU's MQA target of 5
    got = {t["what"].split(" ")[0]: t for t in kv.targets(rows, "cuda")}
    assert {t["context"] for k, t in got.items() if k != "worst"} == {4096}
    assert got["tied_kv"]["met"] and not got["gqa_4"]["met"] and got["gqa_2"]["met"]
    assert not got["mqa"]["met"] and got["standard"]["measured"] == pytest.approx(0.8)
    # standard's read is held to the 60% of copy on a GPU, to our 70% on the CPU
    cpu = {t["what"].split(" ")[0]: t for t in kv.targets(rows, "cpu")}
    assert (got["standard"]["target"], cpu["standard"]["target"]) == (0.6, 0.7)
    # mqa: products bound 4x4/10 = 1.6 < memory bound 4: stopped by the BLAS, below target
    assert got["mqa"]["bounded_by"] == "BLAS products (6.0 GB/s vs copy 10.0 GB/s)"
    assert got["mqa"]["products_bound"] == pytest.approx(1.6)
    # gqa_4: both bounds 1.5 < 1.8; memory where they tie; met targets name no bound
    assert got["gqa_4"]["bounded_by"] == "memory" and got["tied_kv"]["bounded_by"] == ""
    # standard's read (0.8, met): products at 9 of copy 10 GB/s beside memory's 1.0
    assert got["standard"]["products_bound"] == pytest.approx(0.9)
    assert got["standard"]["bounded_by"] == ""
    # the choice's target, over the whole grid: gqa_2 at 512 ran at 0.9x its own SDPA
    assert got["worst"]["what"] == "worst layout on its kernel / on SDPA (gqa_2, blocked)"
    assert (got["worst"]["context"], got["worst"]["measured"]) == (512, pytest.approx(0.9))
    assert not got["worst"]["met"] and got["worst"]["bounded_by"] == "the kernel choice"
    rest = [r for r in rows if (r["context"], r["design"]) != (512, "gqa_2")]
    assert kv.own_sdpa(rest)["met"] and kv.own_sdpa(rest)["measured"] == pytest.approx(0.97)
    # SDPA against itself (standard chose it) read 0.88 somewhere: a 0.9 miss is within noise
    noisy = [{**r, "own_sdpa": 0.88} if r["design"] == "standard" and r["context"] == 4096
             else r for r in rows]
    assert kv.own_sdpa(noisy)["bounded_by"] == ("the kernel choice; within noise: SDPA against "
                                                "itself read as low as 0.88")
    sdpa_only = [{**r, "kernel": "sdpa"} for r in rows]
    assert kv.own_sdpa(sdpa_only)["met"] and kv.own_sdpa(sdpa_only)["measured"] == 1.0
    # not met, though both bounds clear the target: the bound is named, and that it is not it
    slow = kv._target("x", rows[0], 0.7, 0.5, 1.0, 0.9, {**rows[0], "products_gb_s": 9.0})
    assert slow["bounded_by"] == ("BLAS products (9.0 GB/s vs copy 10.0 GB/s); "
                                  "bound above the target: the rest of the step")
    # a layout whose attention reads its cache slower than its baseline's: its arithmetic
    std = {**rows[0], "design": "standard", "attention_cache_gb_s": 16.0}
    kv_row = {**rows[0], "design": "tied_kv", "attention_cache_gb_s": 10.0}
    capped = kv._target("x", rows[0], 1.8, 1.2, 1.99, None, kv_row, std)
    assert capped["bounded_by"] == ("the attention's work per token: its cache read at "
                                    "10.0 GB/s, standard's at 16.0")
    # reading as fast as its baseline (above SLOWER_READ of it), it is memory again
    level = kv._target("x", rows[0], 1.8, 1.2, 1.99, None, {**kv_row, "attention_cache_gb_s":
                                                            15.0}, std)
    assert level["bounded_by"] == "memory; bound above the target: the rest of the step"
    # slower than its baseline, but as fast as a plain sum of its own tensors reads them (one
    # stream against standard's two): memory at that read rate, not its arithmetic
    streams = kv._target("x", rows[0], 1.8, 1.2, 1.99, None,
                         {**kv_row, "cache_read_gb_s": 10.5}, {**std, "cache_read_gb_s": 17.0})
    assert streams["bounded_by"] == ("memory at its cache's own read rate: its attention reads "
                                     "it at 10.0 GB/s, a plain sum at 10.5; standard's "
                                     "attention at 16.0, its sum at 17.0")
    # a plain sum well ahead of its attention (below SLOWER_READ of it): the arithmetic again
    work = kv._target("x", rows[0], 1.8, 1.2, 1.99, None, {**kv_row, "cache_read_gb_s": 16.0},
                      std)
    assert work["bounded_by"] == capped["bounded_by"]


def test_the_study_reads_the_newest_kv_bench_of_its_own_cpu(tmp_path, monkeypatch):
    """``bench --only kv`` records its rows (measure kv_bench); the study's payoff curve reads
    the newest taken on the CPU of its own kv_decode, else its own, and says which."""
    from qkvlab.bench import kv
    from qkvlab.experiments.store import Store
    from qkvlab.studies.qkv.compute import results
    from qkvlab.studies.qkv.compute.payoff import kv_payoff

    def rows(tokens, rotary=False):  # the bench's grid also holds the rotary pair
        return [{"context": 512, "batch": 1, "design": d, "kernel": "sdpa",
                 "tokens_per_s": tokens * r, "tokens_per_s_sdpa": tokens * r, "ratio": r,
                 "cache_bytes": 1, "cache_share": 0.5, "bound_tokens_per_s": 9.0}
                for d, r in (("standard", 1.0), ("tied_kv", 1.5))
                + ((("rotary_standard", 1.0), ("rotary_tied_kv", 0.3)) if rotary else ())]

    db = tmp_path / "r.db"
    with Store(db) as s:  # a record of the earlier method first (no CPU named), then today's
        s.measure("kv_decode", {"profile": "smoke", "version": 0}, lambda: rows(50.0))
        s.measure("kv_decode", {"profile": "smoke", "cpu_model": "A", "version": 0},
                  lambda: rows(100.0))
    times = iter(["2026-11-26T10:00:00", "2026-11-26T11:00:00", "2026-11-26T12:00:00"])
    monkeypatch.setattr("time.strftime", lambda fmt: next(times))
    for cpu, tokens, device in (("A", 200.0, "cpu"), ("A", 300.0, "cpu"), ("B", 400.0, "cpu")):
        monkeypatch.setattr("qkvlab.env.cpu_model", lambda cpu=cpu: cpu)
        kv.record_kv_bench(db, {"grid": "full", "rows": rows(tokens, rotary=True)}, device)
    monkeypatch.setattr(results, "current", lambda df, name: df.index == df.index)
    with Store(db, readonly=True) as s:
        data = results.StudyData(profile=None, runs=None, comparisons=None, probe=None,
                                 measures=results.measures(s, results.pd.DataFrame(), "smoke"))
    got = kv_payoff(data)
    assert list(got.tokens_per_s) == [300.0, 450.0] and set(got.source) == {"bench"}
    assert list(got.design) == ["standard", "tied_kv"]  # the layouts the study measures
    assert set(got.taken) == {"2026-11-26T11:00:00"}  # A's newest; B is another machine
    kv_rows = data.measures["kv_decode"]
    kv_rows.loc[kv_rows["spec.cpu_model"].notna(), "spec.cpu_model"] = "C"  # a third CPU
    assert set(kv_payoff(data).source) == {"study"}
    assert list(kv_payoff(data).tokens_per_s) == [100.0, 150.0]


def test_the_payoff_caption_says_how_far_the_study_and_the_bench_it_draws_agree(tmp_path,
                                                                                 monkeypatch):
    """Where the curve is the bench's, the study's own ratios to standard are set beside it at
    every point both measured (#40: within 15%), and the figure's caption says so."""
    from qkvlab.bench import kv
    from qkvlab.experiments.store import Store
    from qkvlab.studies.qkv.compute import results
    from qkvlab.studies.qkv.compute.payoff import kv_agreement
    from qkvlab.studies.qkv.render.payoff import fig_q3_kv_payoff

    def rows(ratios, contexts):
        return [{"context": T, "batch": 8, "design": d, "kernel": k, "tokens_per_s": 100.0 * r,
                 "tokens_per_s_sdpa": 100.0, "ratio": r, "cache_bytes": 1, "cache_share": 0.5,
                 "bound_tokens_per_s": 900.0}
                for T in contexts for d, r, k in (("standard", 1.0, "sdpa"),
                                                  ("tied_kv", ratios[0], "blocked"),
                                                  ("mqa", ratios[1], "blocked"))]

    db = tmp_path / "r.db"
    with Store(db) as s:
        s.measure("kv_decode", {"profile": "smoke", "cpu_model": "A", "version": 0},
                  lambda: rows((1.6, 2.0), (512, 2048)))
    monkeypatch.setattr("qkvlab.env.cpu_model", lambda: "A")
    kv.record_kv_bench(db, {"grid": "full", "rows": rows((1.7, 2.5), (2048, 8192))}, "cpu")
    monkeypatch.setattr(results, "current", lambda df, name: df.index == df.index)
    with Store(db, readonly=True) as s:
        data = results.StudyData(profile=None, runs=None, comparisons=None, probe=None,
                                 measures=results.measures(s, results.pd.DataFrame(), "smoke"))
    got = kv_agreement(data)  # the one context both hold, standard left out
    assert list(zip(got.context, got.design)) == [(2048, "mqa"), (2048, "tied_kv")]
    np.testing.assert_allclose(got.rel, [2.5 / 2.0 - 1, 1.7 / 1.6 - 1], rtol=1e-12)
    assert list(got.within) == [False, True]
    fig = fig_q3_kv_payoff(data, tmp_path)
    assert ("where both measured (2 layout points besides standard), the study's own ratios "
            "to standard are within 15% of the bench's at 1 (largest difference +25%: mqa at "
            "2,048 × 8)") in fig.caption
    assert "(here blocked and sdpa)" in fig.caption
    kv_rows = data.measures["kv_decode"]
    kv_rows["spec.cpu_model"] = "C"  # the study's own curve: nothing to set it beside
    assert kv_agreement(data).empty
    assert "within 15%" not in fig_q3_kv_payoff(data, tmp_path).caption
