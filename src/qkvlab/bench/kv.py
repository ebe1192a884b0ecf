"""When does K = V pay? Batch decoding of a decoder whose KV cache is the cost: tokens/s per
cache layout (standard, tied K=V, Q=K=V, GQA at H/2 and H/4, MQA) against context and batch,
beside the memory bound (bytes a step reads / copy bandwidth), and the figure of it. (Records
taken before the CPU decode kernel became packed SDPA also hold a BLAS products bound: the old
kernel's two batched GEMMs alone; their targets still name it.)

The measurement is ``models.speed.kv_decode_speed`` (the study's Q3 measure runs it too); here
are the bench's grids, the targets of the issue it answers, and the figure.
"""

from __future__ import annotations

import math
from pathlib import Path

from qkvlab.models.speed import kv_decode_speed

GRIDS = {  # (contexts, batches, rounds): the default bench's part stays near a minute
    "small": ((512, 4096), (1, 8), 5),
    "full": ((512, 2048, 8192, 32768), (1, 4, 16), 5),
}
# ratio to standard, the (#40) CPU targets; on a GPU MQA's is 5
TARGETS = {"tied_kv": 1.8, "gqa_4": 1.8, "gqa_2": 3.0, "mqa": 4.0, "rotary_tied_kv": 1.6}
GPU_TARGETS = {**TARGETS, "mqa": 5.0}
CACHE_SHARE = 0.8  # targets apply where the cache is >= 80% of the bytes a step reads
# standard's attention reads its cache at >= this share of copy bandwidth: on a GPU the issue's
# (#40: 60% on the H100), on the CPU ours (the issue sets none there; the Numba kernel reads 0.81
# at one thread on the EPYC, docs/bench-history.md)
BANDWIDTH_TARGET = 0.7
GPU_BANDWIDTH_TARGET = 0.6
OWN_SDPA = 0.95  # no layout's step on its chosen kernel below this x the same step on SDPA
# a layout whose attention reads its cache below this share of its baseline's read is bound by
# its attention's arithmetic, not by its bytes
SLOWER_READ = 0.9


def bench_kv(grid: str = "small", device: str = "cpu", log=print) -> dict:
    """The kv-decode rows at ``grid`` (``GRIDS``) and the targets read off them."""
    contexts, batches, rounds = GRIDS[grid]
    log(f"kv decode ({grid}): contexts {contexts}, batches {batches}, {device}")
    rows = kv_decode_speed(contexts, batches, rounds=rounds, device=device, log=log,
                           rotary=grid == "full")
    return {"grid": grid, "rows": rows, "targets": targets(rows, device)}


def record_kv_bench(db, kv: dict, device: str) -> dict:
    """Record a ``bench_kv`` result in the results store at ``db`` as one ``kv_bench`` measure:
    its rows, under a spec naming the grid, device, CPU model, threads, PyTorch and when it was
    taken (each bench run is a record of its own). The study's Q3 payoff curve reads the newest
    one taken on the CPU its own measurement ran on (``compute.payoff.kv_payoff``). Returns
    the spec."""
    import time

    import torch

    from qkvlab.env import cpu_model
    from qkvlab.experiments.store import Store

    spec = {"grid": kv["grid"], "device": device, "cpu_model": cpu_model(),
            "threads": torch.get_num_threads(), "torch": torch.__version__,
            "order": "alternating", "taken": time.strftime("%Y-%m-%dT%H:%M:%S")}
    with Store(db) as store:
        store.measure("kv_bench", spec, lambda: kv["rows"])
    return spec


def targets(rows: list[dict], device: str = "cpu") -> list[dict]:
    """Each target (``TARGETS``, on CUDA ``GPU_TARGETS``) at the longest context (largest batch
    there) whose standard cache is >= 80% of what a step reads: measured against the target,
    met or not, beside the same figure were every step at its memory bound (``bound``) and, in
    records that hold it, at the old kernel's BLAS products' floor (``products_bound``), and
    for a target not met the lower one (``bounded_by``)."""
    std = [r for r in rows if r["design"] == "standard" and r["cache_share"] >= CACHE_SHARE]
    if not std:
        return []
    at = max(std, key=lambda r: (r["context"], r["batch"]))
    point = {r["design"]: r for r in rows
             if (r["context"], r["batch"]) == (at["context"], at["batch"])}
    out = []
    for d, t in (GPU_TARGETS if str(device).startswith("cuda") else TARGETS).items():
        if d in point:
            r = point[d]
            base = point.get(r.get("baseline", "standard"), at)
            prod = (r["products_bound_tokens_per_s"] / base["products_bound_tokens_per_s"]
                    if "products_bound_tokens_per_s" in r else None)
            out.append(_target(f"{d} / {r.get('baseline', 'standard')} tokens/s", at, t,
                               r["ratio"], r["bound_tokens_per_s"] / base["bound_tokens_per_s"],
                               prod, r, base))
    read = at["attention_cache_gb_s"] / at["copy_gb_s"]
    prod = at["products_gb_s"] / at["copy_gb_s"] if "products_gb_s" in at else None
    want = GPU_BANDWIDTH_TARGET if str(device).startswith("cuda") else BANDWIDTH_TARGET
    out.append(_target("standard attention cache read / copy bandwidth", at, want, read, 1.0,
                       prod, at))
    return out + [own_sdpa(rows)]


def own_sdpa(rows: list[dict]) -> dict:
    """The kernel choice's target, over the whole grid: where a layout chose the blocked kernel,
    the worst ratio of its step to the same step pinned to SDPA (``own_sdpa``, paired by round;
    >= ``OWN_SDPA``: the choice never costs more than noise). Where it chose SDPA the two are
    the same code, so their ratio is the measurement's own noise: its lowest (``noise``) is
    named beside a miss that it covers. Not met, it is bounded by the choice, not by a bound."""
    blocked = [r for r in rows if r["kernel"] != "sdpa"]
    same = [r["own_sdpa"] for r in rows if r["kernel"] == "sdpa"]
    noise = min(same) if same else None
    if not blocked:
        return {"what": "worst layout on its kernel / on SDPA (every layout chose SDPA)",
                "context": None, "batch": None, "target": OWN_SDPA, "measured": 1.0,
                "met": True, "bound": 1.0, "products_bound": None, "bounded_by": "",
                "noise": noise}
    worst = min(blocked, key=lambda r: r["own_sdpa"])
    x = worst["own_sdpa"]
    by = ""
    if x < OWN_SDPA:
        by = "the kernel choice"
        if noise is not None and x >= noise:
            by += f"; within noise: SDPA against itself read as low as {noise:.2f}"
    return {"what": f"worst layout on its kernel / on SDPA ({worst['design']}, "
                    f"{worst['kernel']})", "context": worst["context"], "batch": worst["batch"],
            "target": OWN_SDPA, "measured": x, "met": x >= OWN_SDPA, "bound": 1.0,
            "products_bound": None, "bounded_by": by, "noise": noise}


def _target(what: str, at: dict, want: float, measured: float, bound: float,
            products_bound: float | None, row: dict, base: dict | None = None) -> dict:
    """One target's row; ``bounded_by`` names what stops it where it is not met, "" where met:
    "BLAS products (X GB/s vs copy Y GB/s)" where a record's products floor is below the memory
    bound; else, where the layout's attention alone reads its cache slower than its
    ``base``line's (below ``SLOWER_READ`` of it): where it reads as fast as a plain sum of the
    same tensors does (``cache_read_gb_s``, at least ``SLOWER_READ`` of it), memory, at that
    layout's own read rate (a K=V cache is one tensor where standard's is two, and a machine
    may stream them at different rates; the arithmetic is then not what stops it), else the
    attention's work per token, with both reads (the step's bytes would allow more, its
    arithmetic does not); else "memory"."""
    met = measured >= want
    by = ""
    if not met:
        products = products_bound is not None and products_bound < bound
        slower = (base is not None and base is not row and "attention_cache_gb_s" in row
                  and row["attention_cache_gb_s"] < SLOWER_READ * base["attention_cache_gb_s"])
        if products:
            by = (f"BLAS products ({row['products_gb_s']:.1f} GB/s vs copy "
                  f"{row['copy_gb_s']:.1f} GB/s)")
        elif slower and row.get("cache_read_gb_s", math.inf) * SLOWER_READ <= \
                row["attention_cache_gb_s"]:  # as fast as its tensors stream: their read
            by = (f"memory at its cache's own read rate: its attention reads it at "
                  f"{row['attention_cache_gb_s']:.1f} GB/s, a plain sum at "
                  f"{row['cache_read_gb_s']:.1f}; {base['design']}'s attention at "
                  f"{base['attention_cache_gb_s']:.1f}, its sum at "
                  f"{base.get('cache_read_gb_s', math.nan):.1f}")
        elif slower:  # the bytes would allow more; the arithmetic does not
            by = (f"the attention's work per token: its cache read at "
                  f"{row['attention_cache_gb_s']:.1f} GB/s, {base['design']}'s at "
                  f"{base['attention_cache_gb_s']:.1f}")
        else:
            by = "memory"
        if (products or not slower) and \
                min(bound, products_bound if products_bound is not None else bound) >= want:
            by += "; bound above the target: the rest of the step"
    return {"what": what, "context": at["context"], "batch": at["batch"], "target": want,
            "measured": measured, "met": met, "bound": bound, "products_bound": products_bound,
            "bounded_by": by}


def kv_figure(rows: list[dict], path: Path) -> Path:
    """Tokens/s against context per layout, one panel per batch, with each layout's memory bound
    (dashed) and BLAS products bound (dotted, where measured): saved as a PNG at ``path``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    batches = sorted({r["batch"] for r in rows})
    fig, axes = plt.subplots(1, len(batches), figsize=(4.2 * len(batches), 3.6), squeeze=False)
    for ax, B in zip(axes[0], batches):
        for i, d in enumerate(dict.fromkeys(r["design"] for r in rows)):
            rs = sorted((r for r in rows if r["design"] == d and r["batch"] == B),
                        key=lambda r: r["context"])
            x = [r["context"] for r in rs]
            line, = ax.plot(x, [r["tokens_per_s"] for r in rs], "o-", label=d, color=f"C{i}")
            ax.plot(x, [r["bound_tokens_per_s"] for r in rs], "--", color=line.get_color(),
                    alpha=0.5)
            if all("products_bound_tokens_per_s" in r for r in rs):
                ax.plot(x, [r["products_bound_tokens_per_s"] for r in rs], ":",
                        color=line.get_color(), alpha=0.7)
        ax.set(xscale="log", yscale="log", title=f"batch {B}", xlabel="context (tokens)")
    prods = all("products_bound_tokens_per_s" in r for r in rows)
    axes[0][0].set_ylabel("tokens/s" + ("\n(dashed: memory bound, dotted: products bound)"
                                        if prods else " (dashed: memory bound)"))
    axes[0][-1].legend(fontsize=7)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
