"""The bench's result as Markdown tables (``bench_tables``), the CPU's bf16 line first.

Reads the dict ``run.run_bench`` returns (or its saved JSON, older results included: a
missing column prints empty) and nothing else.
"""

from __future__ import annotations

from qkvlab.bench.peers import PEER_SETTINGS
from qkvlab.tables import markdown_table
from qkvlab.timing import SPEED_MARGIN


def _cpu_table(res: dict) -> str:
    """The CPU, whether it has native bf16, and what bf16 autocast cost on it: the probe's
    time ratio and, where training was measured, qkvlab's fp32/bf16 tokens/s per size."""
    c = res["cpu"]
    native = {True: "yes", False: "no", None: "unknown"}[c.get("native_bf16")]
    if c.get("bf16_flags"):
        native += f" ({', '.join(c['bf16_flags'])})"
    headers = ["cpu", "capability", "native bf16", "bf16/fp32 time, probe"]
    row = [c.get("cpu_model") or "?", c.get("cpu_capability") or "?", native, c["bf16_fp32_ratio"]]
    on_cpu = res.get("device", "cpu") == "cpu"  # else the training ratios are the GPU's
    training = res.get("training", {}) if on_cpu else {}
    _add_bf16_training(headers, row, training)
    not_measured = [size for size, r in training.items() if not r.get("qkvlab_bf16")]
    skipped = (f"; bf16 training not measured at the {' and '.join(not_measured)} size: "
               "no native bf16 (see measure_bf16)") if not_measured else ""
    return ("CPU and bf16 autocast (time ratios > 1: bf16 is slower; the trainer's "
            "precision='bf16' falls back to fp32 without native bf16)\n\n"
            + markdown_table(headers, [row]) + f"\n\nprobe: {c.get('probe', '')}" + skipped)


def _add_bf16_training(headers: list, row: list, training: dict) -> None:
    """Append a bf16/fp32 time column per size whose training was measured in bf16."""
    for size, r in training.items():
        if r.get("qkvlab_bf16"):
            headers.append(f"bf16/fp32 time, training {size}")
            row.append(r["qkvlab"] / r["qkvlab_bf16"])


def _gpu_table(res: dict) -> str:
    """The GPU the bench ran on and what bf16 autocast did to qkvlab's training on it."""
    g = res["gpu"]
    headers = ["device", "gpu", "compute capability", "bf16 supported", "CUDA"]
    row = [res["device"], g["gpu"], g["capability"], "yes" if g["bf16"] else "no", g["cuda"]]
    _add_bf16_training(headers, row, res.get("training", {}))
    return ("GPU: training, the attention layers and decoding ran here (fold_alt on the CPU; "
            "time ratios > 1: bf16 is slower)\n\n" + markdown_table(headers, [row]))


def _training_tables(training: dict) -> str:
    """Per size and peer: the peer's tokens/s, qkvlab's under the peer's settings, and the
    ratio (median over rounds, with min-max); then qkvlab's default in bf16 and compiled."""
    rows, extra = [], []
    any_bf16 = any("qkvlab_bf16" in r for r in training.values())
    for size, r in training.items():
        for p, v in r.get("vs_peer", {}).items():
            rows.append([size, p, PEER_SETTINGS.get(p, ""), int(r[p]), int(r[v["qkvlab"]]),
                         v["ratio"], f"{v['min']:.2f}-{v['max']:.2f}", _ci(v), _verdict(v)])
        row = [size, int(r["qkvlab"])]
        if "qkvlab_bf16" in r:
            row += [int(r["qkvlab_bf16"]), r["bf16_loss_gap"]]
        elif any_bf16:  # another size was measured in bf16: keep the columns in place
            row += ["not measured", ""]
        if "compiled" in r:
            c = r["compiled"]
            row += [c["ratio"], f"{c['min']:.2f}-{c['max']:.2f}", r["compile_s"]]
        extra.append(row)
    rounds = {r.get("rounds") for r in training.values()}
    text = (f"Training tokens/s, fp32, qkvlab under each peer's settings (ratio > 1: qkvlab is "
            f"faster; median of {'/'.join(map(str, sorted(x for x in rounds if x)))} interleaved "
            f"rounds, min-max; 95% CI of the geometric-mean ratio over the paired rounds; "
            f"level: its 90% CI inside 1 ± {SPEED_MARGIN:.0%})\n\n" + markdown_table(
                ["size", "peer", "matched settings", "peer tokens/s", "qkvlab tokens/s", "ratio",
                 "spread", "95% CI", f"verdict (±{SPEED_MARGIN:.0%})"], rows))
    heads = ["size", "qkvlab default fp32"]
    if any_bf16:
        heads += ["qkvlab bf16", "max |loss fp32 - bf16|"]
    if any("compiled" in r for r in training.values()):
        heads += ["compiled / eager", "spread", "compile s"]
    extra = [r + [""] * (len(heads) - len(r)) for r in extra]
    return (text + "\n\nqkvlab's default model (biases, tanh GELU)\n\n"
            + markdown_table(heads, extra))


def _ci(v: dict) -> str:
    return f"{v['ci_lo']:.2f}-{v['ci_hi']:.2f}" if v.get("ci_lo") is not None else ""


def _verdict(v: dict) -> str:
    """``ratio_stats``' verdict; undecided with the rounds that would decide it."""
    if v.get("verdict") == "undecided" and v.get("rounds_needed"):
        return f"undecided · n≈{v['rounds_needed']} rounds"
    return v.get("verdict", "")


def _decode_row(size: str, r: dict) -> list:
    """One row of the decode table (older results lack the bounds and the kernel)."""
    def tok(key):
        return int(r[key]) if key in r else ""
    kernel = f"{r['gemv_kernel']} ({r['gemv_probe']:.2f}x)" if "gemv_kernel" in r else ""
    return [size, int(r["qkvlab"]), int(r["hf_generate"]),
            r.get("ratio", r["qkvlab"] / r["hf_generate"]),
            f"{r['min']:.2f}-{r['max']:.2f}" if "min" in r else "", tok("bound_tokens_per_s"),
            tok("gemv_tokens_per_s"),
            r["gemv_tokens_per_s"] / r["hf_generate"] if "gemv_tokens_per_s" in r else "",
            kernel, tok("gemv_ours_tokens_per_s"), r.get("weight_mb_per_token", ""),
            r.get("bandwidth_gb_s", ""), r["max_logit_diff"]]


def bench_tables(res: dict) -> str:
    """Markdown tables of a ``run_bench`` result, the CPU's bf16 line first."""
    out = []
    if "cpu" in res:
        out.append(_cpu_table(res))
    if "gpu" in res:
        out.append(_gpu_table(res))
    if "training" in res:
        out.append(_training_tables(res["training"]))
    if "attention" in res:
        rows = [[d, r["time_vs_standard"], r["flops_vs_standard"]]
                for d, r in res["attention"].items()]
        out.append("Attention layer forward+backward (causal), relative to standard\n\n" +
                   markdown_table(["design", "time ratio", "FLOPs ratio"], rows))
    if "decode" in res:
        rows = [_decode_row(size, r) for size, r in res["decode"].items()]
        out.append("Batch-1 greedy decoding with the KV cache, same weights; bound = copy "
                   "bandwidth / weight bytes per token; GEMVs alone = the step's matrix-vector "
                   "products without the rest (the floor where the weights fit in cache, or where "
                   "the CPU's GEMV kernel reads slower than it copies), with F.linear (HF's "
                   "kernel) and with the kernel qkvlab's decoding chose "
                   "(qkvlab.kernels.decode_kernel: batched GEMM over row blocks where its probe "
                   "measured it 1.2x faster or more, else F.linear; the probe's ratio in "
                   "brackets); ratio at HF's GEMV floor = F.linear GEMVs / HF: the ratio a decoder "
                   "doing nothing but HF's GEMVs would reach\n\n" + markdown_table(
                       ["size", "qkvlab tokens/s", "HF generate tokens/s", "ratio", "spread",
                        "bound tokens/s", "GEMVs alone, F.linear, tokens/s",
                        "ratio at HF's GEMV floor", "qkvlab GEMV kernel",
                        "GEMVs alone, qkvlab's kernel, tokens/s", "weights MB/token", "copy GB/s",
                        "max |Δlogit|"], rows))
    if "cache_bytes" in res:
        rows = [[k, v] for k, v in res["cache_bytes"].items()]
        out.append("KV-cache bytes per token, all layers, fp32\n\n"
                   + markdown_table(["design", "bytes/token"], rows))
    if "kv_decode" in res:
        cpu = res.get("cpu_model") or res.get("cpu", {}).get("cpu_model") or "?"
        out.append(f"CPU: {cpu}, {res.get('threads', '?')} thread(s)\n\n"
                   + _kv_tables(res["kv_decode"]))
    if "fold_alt" in res:
        r = res["fold_alt"]
        out.append("fold_alt on a trained alt model\n\n" + markdown_table(
            ["train loss", "max |Δlogit| fp32", "max |Δlogit| fp64", "params alt", "params folded",
             "speed folded/alt"],
            [[f"{r['train_loss_first']:.3f} → {r['train_loss_last']:.3f}", r["max_abs_diff_fp32"],
              r["max_abs_diff_fp64"], r["params_alt"], r["params_folded"],
              r["speed_folded_vs_alt"]]]))
    return "\n\n".join(out)


def _kv_tables(kv: dict) -> str:
    """The KV-decode sweep: per (context, batch) and layout, tokens/s with the chosen decode
    attention and with SDPA, the ratio to standard, cache and bound; then the targets. Records
    taken before the decode kernel became packed SDPA (2026-11-26) also hold its BLAS
    products' floor, shown in two more columns."""
    prods = any("products_gb_s" in r for r in kv["rows"])
    reads = any("cache_read_gb_s" in r for r in kv["rows"])
    rows = [[r["context"], r["batch"], r["design"], int(r["tokens_per_s"]),
             int(r["tokens_per_s_sdpa"]), r.get("own_sdpa", ""), r["ratio"],
             f"{r['ratio_min']:.2f}-{r['ratio_max']:.2f}",
             r["cache_bytes"] / 1e6, f"{r['cache_share']:.0%}", int(r["bound_tokens_per_s"]),
             r["attention_cache_gb_s"]] + ([r.get("cache_read_gb_s", "")] if reads else [])
            + ([r.get("products_gb_s", ""), int(r["products_bound_tokens_per_s"])
                if "products_bound_tokens_per_s" in r else ""] if prods else [])
            + [r["kernel"]] for r in kv["rows"]]
    copy = kv["rows"][0]["copy_gb_s"] if kv["rows"] else 0.0
    text = ("When does K = V pay? One batch decoding step, cache of `context` tokens (random), "
            "one layer d_model 512, 8 heads of 64; ratio = tokens/s / standard's, a rotary "
            "layout's / rotary standard's (median of interleaved rounds, min-max); on kernel / "
            "on SDPA = the step on its chosen decode attention over the same step pinned to "
            "SDPA, paired by round (where it chose SDPA: "
            f"the measurement's noise); bound = batch x copy bandwidth ({copy:.1f} GB/s) / "
            "(cache + weight bytes); attention GB/s = cache bytes / the attention alone"
            + ("; read GB/s = cache bytes / a plain sum of the same cache tensors" if reads
               else "")
            + ("; products GB/s = cache bytes / the blocked kernel's two products alone "
               "(scores, weighted sum), products bound = batch / their time per step"
               if prods else "") + "\n\n"
            + markdown_table(["context", "batch", "design", "tokens/s", "tokens/s, SDPA",
                              "on kernel / on SDPA", "ratio", "spread", "cache MB",
                              "cache share", "bound tokens/s", "attention GB/s"]
                             + (["read GB/s"] if reads else [])
                             + (["products GB/s", "products bound tokens/s"] if prods else [])
                             + ["decode attention"], rows))
    if kv.get("targets"):
        tprods = any(x.get("products_bound") is not None for x in kv["targets"])
        t = [[x["what"], x["context"] or "", x["batch"] or "", x["target"], x["measured"],
              "met" if x["met"] else "not met", x["bound"]]
             + (["" if x.get("products_bound") is None else x["products_bound"]]
                if tprods else []) + [x.get("bounded_by", "")] for x in kv["targets"]]
        text += ("\n\nTargets at the longest context where the cache is >= 80% of a step's "
                 "bytes (memory bound: the same figure were every step at its memory bound"
                 + ("; products bound: at the floor of its BLAS products; bounded by: the lower "
                    "of the two, where not met" if tprods else "; bounded by: what stops a "
                    "target not met") + ")\n\n" + markdown_table(
                     ["target", "context", "batch", "want", "measured", "", "memory bound"]
                     + (["products bound"] if tprods else []) + ["bounded by"], t))
    return text
