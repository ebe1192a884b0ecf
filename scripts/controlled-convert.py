"""The controlled conversion (#38 item 4), a first measurement: a decoder whose pretraining is
ours, converted to K = V and uptrained, against K = V trained from scratch for the same total
steps and against the untied model trained on the same way.

    python scripts/controlled-convert.py [--db results/controlled.db] [--seeds 0,1,2]

Decided before the runs (and why):
- Pretraining: the study's standard lm (BPE of 1,024 symbols, 64-token windows, d_model 64, 2
  layers, 4 heads, batch 16, 1,000 steps: the standard profile's lm, where standard beats the
  attention-free control) at standard's chosen rate, ``S`` = 1,000 steps, seeds 0, 1, 2.
- Arms at each uptraining share u of S (1%, 5%, 20%):
  ``converted``: the pretrained model tied K = V from the fitted start (``models.tie``),
  trained u·S more steps; ``continued``: the untied pretrained model trained the same u·S steps
  the same way (what the extra steps alone give); ``scratch_kv`` and ``scratch``: tied K = V and
  standard trained from scratch for (1 + u)·S steps at the pretraining recipe; ``control``: the
  uniform-attention model from scratch for S steps (attention must be used at this budget).
- Rates, chosen on the val split with a tuning seed (100) that is never reported, as the study
  does: each from-scratch design (standard, tied_kv, uniform) among the standard profile's
  grid (1/3, 1, 3, 9) × 2e-3 at S steps; the uptraining's peak rate per arm (converted,
  continued) among (0.1, 0.3, 1) × the pretraining rate at u = 5%, from the tuning seed's own
  pretrained model, the grid extended by factors of 3 while the choice sits on its edge.
  Uptraining: AdamW, warmup max(1, u·S/10) steps, cosine to 0.1 × peak.
- Metric: held-out test loss per subword token (16 batches of the test split), as % perplexity
  per token between arms paired by seed; 95% t intervals; the study's ±2% per-token margin;
  Holm over the six comparisons (converted vs scratch_kv and vs continued at each u).

Every run is a measure ``controlled_convert`` in the store (resumable: a stored one is read
back). ``--report PATH`` writes the table of the stored records (docs/controlled-convert.md).
"""

import argparse
import math
import tempfile
from pathlib import Path

import torch

from qkvlab import load_model, save_model
from qkvlab.experiments.store import Store
from qkvlab.models.tie import tie_kv
from qkvlab.stats import decide, holm, paired
from qkvlab.tables import markdown_table
from qkvlab.train import TrainConfig, run_from_spec, train
from qkvlab.train.build import make_task
from qkvlab.train.trainer import FINAL_MODEL

VERSION = 2  # 2: every rate chosen on val
TASK = {"seq_len": 64, "tokenizer": "bpe", "vocab_size": 1024}
MODEL = {"d_model": 64, "n_layers": 2, "n_heads": 4}
S, LR, BATCH, TEST_BATCHES = 1000, 6e-3, 16, 16
BASE_LR = 2e-3                                  # the grid's unit (the study's lm rate)
GRID = (1 / 3, 1.0, 3.0, 9.0)                   # the standard profile's lr_grid
UP_GRID = (0.1, 0.3, 1.0)                       # × the pretraining rate, for the uptraining
TUNE_SEED, TUNE_U = 100, 0.05
SHARES = (0.01, 0.05, 0.2)
MARGIN_PCT = 2.0  # the study's per-token margin (plan.vocab.TOKEN_MARGIN_PCT)
CALIB_BATCHES = 8


def spec(design: str, steps: int, seed: int, lr: float) -> dict:
    return {"task": "lm", "task_options": TASK, "model": {**MODEL, "design": design},
            "train": {"steps": steps, "lr": lr, "batch_size": BATCH,
                      "test_batches": TEST_BATCHES, "seed": seed}}


def _result(r) -> dict:
    return {"status": r.status, "test_loss": r.final.get("test_val_loss", math.nan),
            "val_loss": r.final.get("val_loss", math.nan)}


def scratch(design: str, steps: int, seed: int, lr: float, keep: Path | None = None) -> dict:
    with tempfile.TemporaryDirectory() as d:
        r = run_from_spec(spec(design, steps, seed, lr), run_dir=d, progress=False)
        if keep is not None and r.status == "done":
            keep.parent.mkdir(parents=True, exist_ok=True)
            save_model(load_model(Path(d) / FINAL_MODEL), keep)
    return _result(r)


def uptrain(pretrained: Path, arm: str, u: float, seed: int, lr: float) -> dict:
    task = make_task("lm", TASK)
    model = load_model(pretrained)
    if arm == "converted":
        gen = torch.Generator().manual_seed(10_000 + seed)
        calib = [task.batch("train", BATCH, gen)["idx"] for _ in range(CALIB_BATCHES)]
        model = tie_kv(model, calib, "fitted")
    steps = max(1, round(u * S))
    cfg = TrainConfig(steps=steps, lr=lr, batch_size=BATCH,
                      warmup=max(1, steps // 10), test_batches=TEST_BATCHES, seed=seed + 1)
    return _result(train(model, task, cfg, progress=False)) | {"steps": steps}


def _best(rows: dict[float, dict]) -> float:
    ok = {lr: r["val_loss"] for lr, r in rows.items()
          if r["status"] == "done" and math.isfinite(r["val_loss"])}
    if not ok:
        raise ValueError(f"every rate diverged: {sorted(rows)}")
    return min(ok, key=ok.get)


def measure(store: Store, seeds: tuple[int, ...], log=print) -> tuple[list[dict], dict]:
    """Every run's record, and the rates chosen on val."""
    recs, rates = [], {}

    def keep_of(seed, lr):
        return store.runs_dir / "controlled" / f"pretrained-{VERSION}-{S}-{seed}-{lr:g}.safetensors"

    def one(arm, u, seed, lr, fn, tuning=False):
        s = {"version": VERSION, "task": TASK, "model": MODEL, "S": S, "batch": BATCH,
             "test_batches": TEST_BATCHES, "seed": seed, "arm": arm, "u": u, "lr": lr}
        r = store.measure("controlled_convert", s, fn)[0]
        log(f"seed {seed} {arm} u={u} lr {lr:.3g}: val {r['val_loss']:.4f} test "
            f"{r['test_loss']:.4f} ({r['status']})")
        if not tuning:
            recs.append({**r, "arm": arm, "u": u, "seed": seed, "lr": lr})
        return r

    def pretrained(seed, lr, tuning=False):
        keep = keep_of(seed, lr)
        if not keep.exists():  # the uptraining arms need the file: train it again if gone
            with store.tx() as c:
                c.execute("DELETE FROM measures WHERE name='controlled_convert' AND "
                          "json_extract(spec, '$.arm')='pretrained' AND json_extract(spec, "
                          "'$.seed')=? AND json_extract(spec, '$.S')=? AND "
                          "json_extract(spec, '$.version')=?", (seed, S, VERSION))
        one("pretrained", 0.0, seed, lr, lambda: scratch("standard", S, seed, lr, keep), tuning)
        return keep

    # the rates, on val, with the tuning seed
    for design in ("standard", "tied_kv", "uniform"):
        rows = {BASE_LR * m: one(f"tune:{design}", 0.0, TUNE_SEED, BASE_LR * m,
                                 lambda m=m: scratch(design, S, TUNE_SEED, BASE_LR * m),
                                 tuning=True) for m in GRID}
        rates[design] = _best(rows)
    tune_keep = pretrained(TUNE_SEED, rates["standard"], tuning=True)
    for arm in ("converted", "continued"):
        rows, grid = {}, list(UP_GRID)
        while True:  # a choice on the grid's edge extends the grid until it is inside
            for m in grid:
                lr = rates["standard"] * m
                if lr not in rows:
                    rows[lr] = one(f"tune:{arm}", TUNE_U, TUNE_SEED, lr,
                                   lambda lr=lr: uptrain(tune_keep, arm, TUNE_U, TUNE_SEED, lr),
                                   tuning=True)
            best = _best(rows)
            if best == min(rows) and len(rows) < len(UP_GRID) + 3:
                grid.append(min(grid) / 3)
            elif best == max(rows) and len(rows) < len(UP_GRID) + 3:
                grid.append(max(grid) * 3)
            else:
                break
        rates[arm] = best
    log(f"rates chosen on val: {rates}")
    for seed in seeds:
        keep = pretrained(seed, rates["standard"])
        one("control", 0.0, seed, rates["uniform"],
            lambda: scratch("uniform", S, seed, rates["uniform"]))
        for u in SHARES:
            total = S + max(1, round(u * S))
            for arm in ("converted", "continued"):
                one(arm, u, seed, rates[arm],
                    lambda arm=arm: uptrain(keep, arm, u, seed, rates[arm]))
            one("scratch_kv", u, seed, rates["tied_kv"],
                lambda: scratch("tied_kv", total, seed, rates["tied_kv"]))
            one("scratch", u, seed, rates["standard"],
                lambda: scratch("standard", total, seed, rates["standard"]))
    return recs, rates


def verdicts(recs: list[dict]) -> list[dict]:
    """converted vs scratch_kv and vs continued at each u: % perplexity per token, paired by
    seed, with the verdict against the margin and Holm's p over the six."""
    at = {(r["arm"], r["u"], r["seed"]): r["test_loss"] for r in recs}
    seeds = sorted({r["seed"] for r in recs})
    rows = []
    for u in SHARES:
        for other in ("scratch_kv", "continued"):
            a = [at[("converted", u, s)] for s in seeds]
            b = [at[(other, u, s)] for s in seeds]
            d = paired(a, b)
            v = decide(d["diff"], d["diff_sd"], d["n_pairs"], math.log1p(MARGIN_PCT / 100))
            rows.append({"u": u, "vs": other, "pct": 100 * math.expm1(d["diff"]),
                         "lo": 100 * math.expm1(d["diff"] - v["half"]),
                         "hi": 100 * math.expm1(d["diff"] + v["half"]), "p": d["p"],
                         "status": v["status"], "n": d["n_pairs"]})
    for r, p in zip(rows, holm([r["p"] for r in rows])):
        r["p_holm"] = p
        if p > 0.05 and r["status"] in ("worse", "better"):
            r["status"] = "undecided"
    return rows


def report(recs: list[dict], rates: dict) -> str:
    at = {(r["arm"], r["u"], r["seed"]): r["test_loss"] for r in recs}
    seeds = sorted({r["seed"] for r in recs})
    mean = lambda arm, u: sum(at[(arm, u, s)] for s in seeds) / len(seeds)  # noqa: E731
    lines = ["Rates chosen on val (tuning seed " + str(TUNE_SEED) + "): "
             + ", ".join(f"{k} {v:.3g}" for k, v in rates.items()) + ".", "",
             markdown_table(["arm", "u", "steps in all", "test loss per token (mean over seeds)"],
                            [["pretrained (standard)", "0", f"{S:,}",
                              f"{mean('pretrained', 0.0):.4f}"],
                             ["control (uniform attention)", "0", f"{S:,}",
                              f"{mean('control', 0.0):.4f}"],
                             *([arm, f"{u:g}", f"{S + max(1, round(u * S)):,}",
                                f"{mean(arm, u):.4f}"] for u in SHARES
                               for arm in ("converted", "continued", "scratch_kv", "scratch"))],
                            cell=str)]
    ctl = paired([at[("control", 0.0, s)] for s in seeds],
                 [at[("pretrained", 0.0, s)] for s in seeds])
    lines += ["", f"The control is {100 * math.expm1(ctl['diff']):+.1f}% per token over the "
              f"pretrained standard model (p {ctl['p']:.2g}, {len(seeds)} seeds).", "",
              markdown_table(["converted (fitted K=V, uptrained) vs", "u",
                              "% perplexity per token (95% CI)",
                              "verdict (±2% margin, Holm over 6)", "Holm p (difference ≠ 0)"],
                             [[r["vs"], f"{r['u']:g}",
                               f"{r['pct']:+.2f}% ({r['lo']:+.2f} to {r['hi']:+.2f})",
                               r["status"], f"{r['p_holm']:.2g}"] for r in verdicts(recs)],
                             cell=str)]
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--db", default="results/controlled.db")
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--pretrain-steps", type=int, default=S, help="S (a smoke run: 20)")
    p.add_argument("--report", default=None, help="write the tables to this Markdown file, "
                   "between its controlled-convert markers")
    args = p.parse_args()
    seeds = tuple(int(s) for s in args.seeds.split(","))
    globals()["S"] = args.pretrain_steps
    torch.set_num_threads(1)
    Path(args.db).parent.mkdir(parents=True, exist_ok=True)
    with Store(args.db) as store:
        recs, rates = measure(store, seeds)
    text = report(recs, rates)
    if args.report:
        begin, end = "<!-- controlled-convert: begin -->", "<!-- controlled-convert: end -->"
        page = Path(args.report).read_text()
        head, _, rest = page.partition(begin)
        _, _, tail = rest.partition(end)
        Path(args.report).write_text(f"{head}{begin}\n{text}\n{end}{tail}")
    print(text)


if __name__ == "__main__":
    main()
