"""The controlled conversion (#38 item 4), a first measurement: a decoder whose pretraining is
ours, converted to K = V and uptrained, against K = V trained from scratch for the same total
steps and against the untied model trained on the same way.

    python scripts/controlled-convert.py [--db results/controlled.db] [--seeds 0,1,2]

Decided before the runs (and why):
- Pretraining: the study's standard lm (BPE of 1,024 symbols, 64-token windows, d_model 64, 2
  layers, 4 heads, batch 16, 1,000 steps at lr 6e-3: the standard profile's lm, where standard
  beats the attention-free control), ``S`` = 1,000 steps, seeds 0, 1, 2.
- Arms at each uptraining share u of S (1%, 5%, 20%):
  ``converted``: the pretrained model tied K = V from the fitted start (``models.tie``),
  trained u·S more steps; ``continued``: the untied pretrained model trained the same u·S steps
  the same way (what the extra steps alone give); ``scratch_kv`` and ``scratch``: tied K = V and
  standard trained from scratch for (1 + u)·S steps at the pretraining recipe; ``control``: the
  uniform-attention model from scratch for S steps (attention must be used at this budget).
- Uptraining recipe: AdamW, peak lr = 0.3 × the pretraining rate (1.8e-3; between the
  pretraining peak and where its cosine ended, 6e-4), warmup max(1, u·S/10) steps, cosine to
  0.1 × peak. Not tuned on val in this first measurement (a stated limit).
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
from qkvlab.train import TrainConfig, run_from_spec, train
from qkvlab.train.build import make_task
from qkvlab.train.trainer import FINAL_MODEL

VERSION = 1
TASK = {"seq_len": 64, "tokenizer": "bpe", "vocab_size": 1024}
MODEL = {"d_model": 64, "n_layers": 2, "n_heads": 4}
S, LR, BATCH, TEST_BATCHES = 1000, 6e-3, 16, 16
UPTRAIN_LR = 0.3 * LR
SHARES = (0.01, 0.05, 0.2)
MARGIN_PCT = 2.0  # the study's per-token margin (plan.vocab.TOKEN_MARGIN_PCT)
CALIB_BATCHES = 8


def spec(design: str, steps: int, seed: int) -> dict:
    return {"task": "lm", "task_options": TASK, "model": {**MODEL, "design": design},
            "train": {"steps": steps, "lr": LR, "batch_size": BATCH,
                      "test_batches": TEST_BATCHES, "seed": seed}}


def scratch(design: str, steps: int, seed: int, keep: Path | None = None) -> dict:
    with tempfile.TemporaryDirectory() as d:
        r = run_from_spec(spec(design, steps, seed), run_dir=d, progress=False)
        if keep is not None and r.status == "done":
            keep.parent.mkdir(parents=True, exist_ok=True)
            save_model(load_model(Path(d) / FINAL_MODEL), keep)
    return {"status": r.status, "test_loss": r.final.get("test_val_loss", math.nan)}


def uptrain(pretrained: Path, arm: str, u: float, seed: int) -> dict:
    task = make_task("lm", TASK)
    model = load_model(pretrained)
    if arm == "converted":
        gen = torch.Generator().manual_seed(10_000 + seed)
        calib = [task.batch("train", BATCH, gen)["idx"] for _ in range(CALIB_BATCHES)]
        model = tie_kv(model, calib, "fitted")
    steps = max(1, round(u * S))
    cfg = TrainConfig(steps=steps, lr=UPTRAIN_LR, batch_size=BATCH,
                      warmup=max(1, steps // 10), test_batches=TEST_BATCHES, seed=seed + 1)
    r = train(model, task, cfg, progress=False)
    return {"status": r.status, "test_loss": r.final.get("test_val_loss", math.nan),
            "steps": steps}


def measure(store: Store, seeds: tuple[int, ...], log=print) -> list[dict]:
    recs = []
    for seed in seeds:
        keep = store.runs_dir / "controlled" / f"pretrained-{VERSION}-{S}-{seed}.safetensors"
        base = {"version": VERSION, "task": TASK, "model": MODEL, "S": S, "lr": LR,
                "batch": BATCH, "test_batches": TEST_BATCHES, "seed": seed}

        def one(arm, u, fn):
            s = {**base, "arm": arm, "u": u, "uptrain_lr": UPTRAIN_LR}
            r = store.measure("controlled_convert", s, fn)[0]
            log(f"seed {seed} {arm} u={u}: test loss {r['test_loss']:.4f} ({r['status']})")
            recs.append({**r, "arm": arm, "u": u, "seed": seed})

        if not keep.exists():  # the pretrained model's file is needed by the uptraining arms
            with store.tx() as c:
                c.execute("DELETE FROM measures WHERE name='controlled_convert' AND "
                          "json_extract(spec, '$.arm')='pretrained' AND "
                          "json_extract(spec, '$.seed')=? AND json_extract(spec, '$.S')=?",
                          (seed, S))
        one("pretrained", 0.0, lambda: scratch("standard", S, seed, keep))
        one("control", 0.0, lambda: scratch("uniform", S, seed))
        for u in SHARES:
            total = S + max(1, round(u * S))
            one("converted", u, lambda: uptrain(keep, "converted", u, seed))
            one("continued", u, lambda: uptrain(keep, "continued", u, seed))
            one("scratch_kv", u, lambda: scratch("tied_kv", total, seed))
            one("scratch", u, lambda: scratch("standard", total, seed))
    return recs


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


def report(recs: list[dict]) -> str:
    at = {(r["arm"], r["u"], r["seed"]): r["test_loss"] for r in recs}
    seeds = sorted({r["seed"] for r in recs})
    mean = lambda arm, u: sum(at[(arm, u, s)] for s in seeds) / len(seeds)  # noqa: E731
    lines = ["| arm | u | steps in all | test loss per token (mean over seeds) |",
             "|---|---|---|---|"]
    lines.append(f"| pretrained (standard) | 0 | {S:,} | {mean('pretrained', 0.0):.4f} |")
    lines.append(f"| control (uniform attention) | 0 | {S:,} | {mean('control', 0.0):.4f} |")
    for u in SHARES:
        for arm in ("converted", "continued", "scratch_kv", "scratch"):
            lines.append(f"| {arm} | {u:g} | {S + max(1, round(u * S)):,} | "
                         f"{mean(arm, u):.4f} |")
    ctl = paired([at[("control", 0.0, s)] for s in seeds],
                 [at[("pretrained", 0.0, s)] for s in seeds])
    lines += ["", f"The control is {100 * math.expm1(ctl['diff']):+.1f}% per token over the "
              f"pretrained standard model (p {ctl['p']:.2g}, {len(seeds)} seeds).", "",
              "| converted (fitted K=V, uptrained) vs | u | % perplexity per token (95% CI) "
              "| verdict (±2% margin, Holm over 6) | Holm p |", "|---|---|---|---|---|"]
    for r in verdicts(recs):
        lines.append(f"| {r['vs']} | {r['u']:g} | {r['pct']:+.2f}% ({r['lo']:+.2f} to "
                     f"{r['hi']:+.2f}) | {r['status']} | {r['p_holm']:.2g} |")
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
        recs = measure(store, seeds)
    text = report(recs)
    if args.report:
        begin, end = "<!-- controlled-convert: begin -->", "<!-- controlled-convert: end -->"
        page = Path(args.report).read_text()
        head, _, rest = page.partition(begin)
        _, _, tail = rest.partition(end)
        Path(args.report).write_text(f"{head}{begin}\n{text}\n{end}{tail}")
    print(text)


if __name__ == "__main__":
    main()
