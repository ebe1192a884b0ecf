"""The uptraining rate of a conversion, chosen on validation text: each rate of a grid uptrains
a fresh student for a short budget, the one with the lowest held-out nll on the stdlib's *val*
files wins (test files are never read here), and the conversion then runs at that rate exactly
as ``--lr`` would (the same spec, so the same stored run). A choice on the grid's edge adds the
next rate beyond it, by the grid's own ratio, until the choice is inside (at most ``EXTEND``).

Why on val and per conversion: the rate a converted model tolerates depends on the model and the
start: on Qwen2.5-Coder-0.5B one step at SmolLM2's 1e-4 took the fitted start from ×7 to ×8,515
over its teacher. The choice is made at the first budget (16,384 tokens), which favours smaller
rates than a long run might want, and which is fragile on SmolLM2's fitted K=V start (its loss
rises again within those steps, and the val score there moves with the thread count): the rate
it picks is the best *there*, and ``TOKENS`` is the knob to choose later. A diverged candidate (a
non-finite loss) scores +inf and cannot be chosen; if every candidate diverges, the choice
fails naming the rates tried.

The val text is ``VAL_TOKENS`` of rows spread evenly over the whole val split
(:func:`val_rows`), not its first files: SmolLM2's first 16,384 val tokens were four ordinary
modules, while about a third of the split's rows are the codec tables of ``encodings/``, on
which the K=V student trained at 9e-6 read ×35–47 its teacher's perplexity and at 1e-4 ×6.6–9.4
(ordinary files: 9e-6 better everywhere). So the first files chose 9e-6 and the whole split
1e-4 (version 2 and 3 of the choice).

K=V's fitted start can choose W_O's basis with the rate (:func:`choose`, ``--o-basis
tied,untied``): each basis's grid is a choice of its own (the spec's ``uptrain`` names a basis
other than the folded one), and the basis whose best rate read val best wins.

Stored as measure ``convert_lr``: one record per rate (lr, val_nll per token, diverged, chosen).
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import tempfile

import torch

from qkvlab.data import pysource
from qkvlab.hf.uptrain import Uptrainer, sequence_nll

VERSION = 3  # 2: a choice on the grid's edge extends the grid; 3: val rows spread (val_rows)
TOKENS = 16384      # each candidate's uptraining: the first budget of every curve
EXTEND = 3          # at most this many rates added beyond a grid whose edge is chosen
VAL_TOKENS = 16384  # scored on this many val tokens (64 sequences of 256)


def val_rows(tokenizer, n_tokens: int, seq_len: int, root: str | None = None) -> torch.Tensor:
    """[n_tokens // seq_len, seq_len] ids: rows of the whole val split (every file tokenized,
    joined, cut into rows of ``seq_len``) taken at evenly spaced places, first and last included.

    Raises:
        ValueError: the split holds fewer rows than asked (names both counts).
    """
    ids, texts = [], pysource.texts("val", root)
    while batch := list(itertools.islice(texts, 64)):
        for x in tokenizer(batch, add_special_tokens=False)["input_ids"]:
            ids.extend(x)
    rows, want = len(ids) // seq_len, n_tokens // seq_len
    if rows < want or want < 1:
        raise ValueError(f"text: the val split of the Python source holds {rows} rows of "
                         f"{seq_len} tokens, need {want} (val_tokens {n_tokens})")
    whole = torch.tensor(ids[:rows * seq_len], dtype=torch.long).view(rows, seq_len)
    return whole[torch.linspace(0, rows - 1, want).round().long()]


def _ppl(nll: float) -> str:
    """A val score for the log: perplexity, or the nll where its exp overflows a float."""
    return f"ppl {math.exp(nll):.3f}" if nll < 700 else f"nll {nll:.1f} per token"


def choose(store, source: str, cfg, grid: tuple[float, ...], bases: tuple[str, ...] = (),
           **kw) -> tuple[float, str]:
    """(rate, W_O basis): :func:`grid_choice` on each basis of ``bases`` (``hf.basis.O_BASES``;
    empty: ``cfg``'s own), each basis's grid its own stored choice, and of the bases the one
    whose chosen rate read val best. A tie falls to the first basis listed.

    Why the basis with the rate: the step a rate takes on W_O depends on the basis (the folded
    W_O' of K=V's fitted start reads keys 10-1,500 times the values' size on Qwen2.5-Coder, so
    one Adam step there at its untied model's rate diverged; docs/convert.md), so the two are
    one choice, made on val like the rate.

    Raises:
        ValueError: as :func:`grid_choice`; or a basis ``cfg``'s tie and start cannot take.
    """
    best = None
    for basis in bases or (cfg.uptrain.o_basis,):
        c = dataclasses.replace(cfg, uptrain=dataclasses.replace(cfg.uptrain, o_basis=basis))
        rec = next(r for r in grid_choice(store, source, c, grid, **kw) if r["chosen"])
        if best is None or rec["val_nll"] < best[0]:
            best = (rec["val_nll"], rec["lr"], basis)
    if len(bases) > 1:
        kw.get("log", print)(f"convert: W_O basis {best[2]!r} chosen (val {_ppl(best[0])} at "
                             f"rate {best[1]:g}) among {list(bases)}")
    return best[1], best[2]


def grid_choice(store, source: str, cfg, grid: tuple[float, ...], *, setup, device: str,
                corpus: str, tokens: int | None = None, val_tokens: int | None = None,
                root=None, log=print, progress: bool = False) -> list[dict]:
    """The stored records (lr, val_nll, diverged, chosen), one per rate tried, of the
    choice of the rate of ``grid`` (extended past a chosen edge) whose student, uptrained for
    ``tokens`` tokens from ``cfg``'s tie and start, reads the val files best (``setup()``: the
    conversion's loaded model, tokenizer and calibration ids). Computed once per spec and
    stored. ``progress``: a bar per candidate's uptraining (minutes each on a CPU).

    Raises:
        ValueError: an empty or non-positive grid, or every rate diverged.
    """
    from qkvlab.env import environment
    from qkvlab.hf.convert import make_student, token_rows
    from qkvlab.progress import bar as make_bar
    from qkvlab.train.precision import autocast, resolve_precision

    grid = tuple(sorted({float(x) for x in grid}))
    if not grid or min(grid) <= 0 or not all(map(math.isfinite, grid)):
        raise ValueError(f"lr grid: need finite positive rates, got {list(grid)}")
    u = cfg.uptrain
    tokens, val_tokens = tokens or TOKENS, val_tokens or VAL_TOKENS
    steps = max(1, tokens // u.tokens_per_step)
    spec = {"model": source, "tie": cfg.tie, "start": cfg.start, "grid": list(grid),
            "tokens": steps * u.tokens_per_step, "val_tokens": val_tokens,
            "calib_tokens": cfg.calib_tokens,
            "uptrain": {k: v for k, v in u.to_dict().items() if k != "lr"}, "corpus": corpus,
            "version": VERSION}

    def compute():
        c = setup()
        teacher = c["model"]
        train = token_rows(c["tok"], "train", steps * u.tokens_per_step, u.seq_len,
                           skip=cfg.calib_tokens, root=root).to(device)
        val = val_rows(c["tok"], val_tokens, u.seq_len, root=root).to(device)
        n = val[:, 1:].numel()
        precision = resolve_precision(u.precision, device)
        out, todo = [], list(grid)
        step = grid[1] / grid[0] if len(grid) > 1 else 3.0
        while todo:
            lr = todo.pop(0)
            student = make_student(teacher, cfg, c["calib"])
            with tempfile.TemporaryDirectory() as tmp:
                trainer = Uptrainer(student, teacher, train, dataclasses.replace(u, lr=lr), tmp,
                                    lambda: autocast(precision, device))
                try:
                    with make_bar(total=steps * u.tokens_per_step, unit="tok",
                                  desc=f"convert rate {lr:g}", disable=not progress) as bar:
                        trainer.run_to(steps, bar)
                    nll = sum(sequence_nll(student, val)) / n
                except FloatingPointError:
                    nll = math.inf
            diverged = not math.isfinite(nll)
            out.append({"lr": lr, "val_nll": None if diverged else nll, "diverged": diverged})
            log(f"convert: rate {lr:g} for {steps * u.tokens_per_step} tokens: val "
                + ("diverged" if diverged else _ppl(nll)))
            del student, trainer
            ok = [r for r in out if not r["diverged"]]
            if not todo and ok and len(out) < len(grid) + EXTEND:  # a choice on the edge
                rates = [r["lr"] for r in out]  # extends the grid until it is inside
                best = min(ok, key=lambda r: r["val_nll"])["lr"]
                if best == min(rates):
                    todo.append(best / step)
                elif best == max(rates):
                    todo.append(best * step)
        ok = [r for r in out if not r["diverged"]]
        if not ok:
            raise ValueError(f"lr grid: every rate diverged ({list(grid)}); try smaller ones")
        best = min(ok, key=lambda r: r["val_nll"])
        return [r | {"chosen": r is best} for r in out]

    recs = store.measure("convert_lr", spec, compute, env=environment())
    lr = next(r["lr"] for r in recs if r["chosen"])
    log(f"convert: rate {lr:g} chosen on {val_tokens} val tokens among "
        f"{sorted(r['lr'] for r in recs)}"
        + (f" (W_O basis {u.o_basis!r})" if u.o_basis != "tied" else ""))
    return recs
