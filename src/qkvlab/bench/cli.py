"""``qkvlab bench``: ``configure(parser)`` and ``run(args) -> int``, delegated to by
``qkvlab.cli``: parse, check the device and the nanoGPT path, run every benchmark, print the
tables and save the result as JSON."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch

from qkvlab.bench.kv import bench_kv, kv_figure, record_kv_bench
from qkvlab.bench.peers import load_nanogpt
from qkvlab.bench.run import check_device, default_device, run_bench
from qkvlab.bench.tables import bench_tables
from qkvlab.env import cpu_model
from qkvlab.fileio import atomic_open


def configure(parser) -> None:
    """The ``bench`` subcommand's arguments."""
    parser.add_argument("--size", choices=["small", "large", "all"], default="all")
    parser.add_argument("--no-peers", action="store_true", help="skip the peer comparisons")
    parser.add_argument("--nanogpt", metavar="PATH", default=None,
                        help="a nanoGPT checkout (its model.py) to add as a peer, "
                             "with and without biases")
    parser.add_argument("--compile", action="store_true",
                        help="also time qkvlab's training under torch.compile, "
                             "with its compile time")
    parser.add_argument("--quick", action="store_true", help="fewer rounds")
    parser.add_argument("--device", default=None,
                        help="cpu or cuda[:N] (default: cuda where PyTorch sees a GPU, else cpu); "
                             "fold_alt runs on the CPU")
    parser.add_argument("--only", choices=["kv", "convert"], default=None,
                        help="kv: only the KV-cache decode sweep, at its full size (contexts to "
                             "32k, batch to 16); the default bench runs a small one. convert: "
                             "uptraining SmolLM2 tied K=V, qkvlab against a plain HF loop")
    parser.add_argument("--threads", type=int, default=None,
                        help="torch threads (default: PyTorch's; on a loaded 2-core machine 1 "
                             "gives steadier ratios)")
    parser.add_argument("--out", default="results/bench.json")
    parser.add_argument("--db", default="results/qkvlab.db",
                        help="with --only kv: the results store its rows are recorded in "
                             "(measure kv_bench), where the study's report reads them in place "
                             "of its own shorter measurement on the same CPU")


def run(args) -> int:
    """Speed ratios against peers and across designs; prints tables, saves JSON."""
    sizes = ("small", "large") if args.size == "all" else (args.size,)
    log = lambda m: print(f"[bench] {m}", file=sys.stderr, flush=True)  # noqa: E731
    try:  # fail now, not after the CPU probe
        device = check_device(args.device or default_device())
        if args.nanogpt is not None:
            load_nanogpt(args.nanogpt)
    except ValueError as e:
        print(f"qkvlab bench: {e}", file=sys.stderr)
        return 2
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.only == "kv":
        res = {"cpu_model": cpu_model(), "device": device,
               "kv_decode": bench_kv("full", device=device, log=log)}
        record_kv_bench(args.db, res["kv_decode"], device)
    elif args.only == "convert":
        from qkvlab.bench.convert import bench_convert, convert_table
        res = {"cpu_model": cpu_model(), "device": device,
               "convert": bench_convert(rounds=3 if args.quick else 5, log=log)}
        res["load_average"] = list(os.getloadavg())
        _write_json(Path(args.out).with_name("bench_convert.json"), res)
        print(convert_table(res["convert"]))
        return 0
    else:
        res = run_bench(sizes, peers=not args.no_peers, quick=args.quick, nanogpt=args.nanogpt,
                        compile=args.compile, device=device, log=log)
    res["torch"] = torch.__version__
    res["threads"] = torch.get_num_threads()
    res["load_average"] = list(os.getloadavg())
    _write_json(Path(args.out), res)  # first: a table that fails to print loses nothing
    print(bench_tables(res))
    if "kv_decode" in res:
        fig = kv_figure(res["kv_decode"]["rows"], Path(args.out).with_name("bench_kv.png"))
        print(f"\nfigure: {fig}")
    print(f"\nsaved {args.out}", file=sys.stderr)
    return 0


def _write_json(path: Path, data) -> None:
    with atomic_open(path, "w") as f:
        json.dump(data, f, indent=1)
