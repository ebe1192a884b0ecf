"""Convert a trained decoder to a tie, then uptrain it: the gap to the teacher against tokens.

``convert(store, source, cfg)`` loads ``source`` (``cost.load_lm``: a zoo name, GGUF file or HF
folder), imposes ``cfg.tie`` with ``cfg.start`` on a copy (the *student*), and uptrains it by
distillation from the untied model (the *teacher*, :mod:`qkvlab.hf.uptrain`) for ``cfg.tokens``
tokens of Python's standard library source (:mod:`qkvlab.data.pysource`: train files for
calibration and uptraining, val files for ``lr_grid``'s choice, test files scored). At 0 tokens
and at every budget of ``budgets(cfg)`` (16k, 64k, 256k, 1M ... and ``tokens``) it scores the
student on ``eval_tokens`` test tokens, per sequence, against the teacher on the same ones.
``tie = "none"`` uptrains the untied model the same way: the text's own effect, which a tie's
gap is read against as well as against the teacher (distilling on code moves the model).

Records (measure ``convert``, one per budget): model, tie, start, tokens, steps, nll, ppl,
ppl_teacher, gap (exp(nll − nll_teacher) − 1, per token), gap_lo/gap_hi (95% bootstrap over the
evaluation sequences, paired), nll_seq (per-sequence summed nll, for pairing with other runs),
eval_tokens, kv_cache and attn_params (relative to the teacher), lr, train_seconds,
tokens_per_s, precision, head_precision, peak_rss_gb and peak_gpu_gb (the process's peaks so
far, teacher and student included); the teacher's per-sequence nll is ``convert_teacher``.
Checkpoints: ``<store>-runs/convert/<key>/``, keyed by all but ``tokens`` (resumed, continued).
"""

from __future__ import annotations

import copy
import dataclasses
import itertools
import json
import math
import resource
import time
from dataclasses import dataclass, field

import numpy as np
import torch

from qkvlab.data import pysource
from qkvlab.hf.basis import check as check_basis, untie_output_basis
from qkvlab.hf.converted import load_converted, save_converted  # noqa: F401 (the API)
from qkvlab.hf.cost import footprint
from qkvlab.hf.tie import STARTS, TieError, calibrate, check, tie
from qkvlab.hf.uptrain import UptrainConfig, Uptrainer, sequence_nll

VERSION = 1
FIRST_BUDGET = 16384


@dataclass(frozen=True)
class ConvertConfig:
    """One conversion: the tie, its start, the budget and the uptraining."""
    tie: str = "kv"                 # kv | qk | qkv | gqa:N | mqa | none
    start: str | None = None        # default: the tie's first start (STARTS)
    tokens: int = 262144
    uptrain: UptrainConfig = field(default_factory=UptrainConfig)
    eval_tokens: int = 32768
    calib_tokens: int = 8192

    def __post_init__(self):
        kind, _ = parse_tie(self.tie)
        starts = STARTS.get(kind, ("none",))
        start = self.start or starts[0]
        if start not in starts:
            raise ValueError(f"start: {start!r} is not a start of tie {self.tie!r}; "
                             f"choose from {list(starts)}")
        object.__setattr__(self, "start", start)
        check_basis(kind, start, (u := self.uptrain).o_basis)
        if self.tokens < u.tokens_per_step:
            raise ValueError(f"tokens: {self.tokens} is less than one batch "
                             f"({u.batch} × {u.seq_len} = {u.tokens_per_step} tokens)")
        for name in ("eval_tokens", "calib_tokens"):
            v = getattr(self, name)
            if v < u.seq_len or v % u.seq_len:
                raise ValueError(f"{name}: {v} must be a positive multiple of seq_len {u.seq_len}")
        if self.eval_tokens < 2 * u.seq_len:  # the CI resamples whole sequences
            raise ValueError(f"eval_tokens: {self.eval_tokens} is one sequence of {u.seq_len}; "
                             "the gap's bootstrap CI needs at least two")

    @property
    def steps(self) -> int:
        return self.tokens // self.uptrain.tokens_per_step

    def spec(self, source: str, corpus: str) -> dict:
        """Everything the records depend on (hashed by the store)."""
        return {"model": source, "tie": self.tie, "start": self.start, "tokens": self.tokens,
                "eval_tokens": self.eval_tokens, "calib_tokens": self.calib_tokens,
                "uptrain": self.uptrain.to_dict(), "corpus": corpus, "version": VERSION}


def _key(spec: dict) -> str:
    """A checkpoint folder's name: sha256 of the canonical JSON of ``spec`` (first 16 hex)."""
    import hashlib
    return hashlib.sha256(json.dumps(spec, sort_keys=True, separators=(",", ":"))
                          .encode()).hexdigest()[:16]


def parse_tie(text: str) -> tuple[str, int]:
    """("kv"|"qk"|"qkv"|"gqa"|"none", kv_heads) from ``kv``, ``gqa:N``, ``mqa``, ``none``."""
    if text == "mqa":
        return "gqa", 1
    if text.startswith("gqa:"):
        try:
            n = int(text[4:])
        except ValueError:
            n = 0
        if n < 1:
            raise ValueError(f"tie: {text!r}: gqa:N needs a positive number of kv heads")
        return "gqa", n
    if text in ("kv", "qk", "qkv", "none"):
        return text, 1
    raise ValueError(f"tie: {text!r} is not one of kv, qk, qkv, gqa:N, mqa, none")


def budgets(cfg: ConvertConfig) -> list[int]:
    """Steps at which the student is scored: 0, then 16k × 4^k tokens below ``tokens``, and
    ``tokens`` itself (each rounded down to whole steps)."""
    per = cfg.uptrain.tokens_per_step
    out, b = [0], FIRST_BUDGET
    while b < cfg.tokens:
        out.append(max(1, b // per))
        b *= 4
    out.append(cfg.steps)
    return sorted(set(out))


# ---- text ---------------------------------------------------------------------------------------
def token_rows(tokenizer, split: str, n_tokens: int, seq_len: int, skip: int = 0,
               root: str | None = None, more: str | None = None) -> torch.Tensor:
    """[n_tokens // seq_len, seq_len] ids of ``split``'s stdlib source after ``skip`` tokens,
    then of ``more``'s files (:func:`qkvlab.data.pysource.more_texts`) if given.

    Files are tokenized 64 at a time (the fast tokenizer's batch runs on every core; each file's
    ids are the same as alone).

    Raises:
        ValueError: the text holds fewer tokens than asked (names both counts).
    """
    need, got = skip + n_tokens, []
    texts = pysource.texts(split, root)
    if more is not None:
        texts = itertools.chain(texts, pysource.more_texts(more))
    while len(got) < need and (batch := list(itertools.islice(texts, 64))):
        for ids in tokenizer(batch, add_special_tokens=False)["input_ids"]:
            got.extend(ids)
    if len(got) < need:
        what = f"the {split} split of the Python source" + (f" and {more}" if more else "")
        raise ValueError(f"text: {what} holds {len(got)} tokens, need {need} (--tokens or "
                         "--eval-tokens too large for it; --more-text adds training text)")
    return torch.tensor(got[skip:need], dtype=torch.long).view(-1, seq_len)


def gap_text(x: float) -> str:
    """A gap (perplexity ratio − 1): ``+12.3%`` below +100%, else the ratio as a factor
    (``×20.7``, ``×389,503``); ``—`` if not a number. The CLI, log and report all use it."""
    if not math.isfinite(x):
        return "—"
    if x < 1:
        return f"{100 * x:+.1f}%"
    return f"×{1 + x:.3g}" if x < 999 else f"×{1 + x:,.0f}"


# ---- statistics ---------------------------------------------------------------------------------
def gap_ci(nll_seq: list[float], base_seq: list[float], tokens_per_seq: int,
           n_boot: int = 2000, seed: int = 0) -> tuple[float, float, float]:
    """(gap, lo, hi): per-token perplexity ratio − 1 of ``nll_seq`` over ``base_seq`` (paired by
    sequence), with a 95% percentile bootstrap over sequences (scipy.stats.bootstrap)."""
    from scipy.stats import bootstrap
    a, b = np.asarray(nll_seq, float), np.asarray(base_seq, float)
    if a.shape != b.shape or a.size < 2:
        raise ValueError(f"gap_ci: need paired sequences, got {a.size} and {b.size}")

    def stat(x, y, axis=-1):
        return np.expm1((x.mean(axis) - y.mean(axis)) / tokens_per_seq)
    res = bootstrap((a, b), stat, paired=True, n_resamples=n_boot, method="percentile",
                    random_state=np.random.default_rng(seed), vectorized=True)
    low, high = res.confidence_interval
    return float(stat(a, b)), float(low), float(high)


# ---- the conversion ------------------------------------------------------------------------------
def make_student(teacher, cfg: ConvertConfig, calib_ids: torch.Tensor | None):
    """A copy of ``teacher`` with the tie imposed from ``cfg.start`` (and its W_O trained in the
    untied basis where ``cfg.uptrain.o_basis`` says so, :mod:`qkvlab.hf.basis`)."""
    kind, kv_heads = parse_tie(cfg.tie)
    student = copy.deepcopy(teacher)
    if kind == "none":
        return student
    cal = calibrate(student, calib_ids) if cfg.start == "fitted" else None
    student = tie(student, kind, calibration=cal, kv_heads=kv_heads, start=cfg.start)
    return untie_output_basis(student, teacher, cal) if cfg.uptrain.o_basis == "untied" else student


def convert(store, source: str, cfg: ConvertConfig, *, device: str = "cpu", out: str | None = None,
            log=print, progress: bool = True, root: str | None = None, loaded=None,
            more_text: str | None = None, time_limit: float | None = None,
            lr_grid: tuple[float, ...] | None = None, lr_tokens: int | None = None,
            o_bases: tuple[str, ...] = ()) -> list[dict]:
    """The records of ``cfg`` on ``source`` (computed, or read back from ``store``); see module.

    ``loaded``: a (model, tokenizer), or a function giving one when first needed (conversions of
    one model share it). ``out``: also write the uptrained student there (``save_converted``).
    ``more_text``: Python source read for training after the stdlib's train split (its
    fingerprint joins the spec's corpus; val and test stay the stdlib's).
    ``time_limit``: seconds from the call on; when they run out the uptraining checkpoints and
    stops, and the budgets reached are stored as the run with ``tokens`` = the last of them
    (every budget is a prefix of the same run, so those records are the ones that shorter run
    gives). A later call with the same arguments resumes from the checkpoint.
    ``lr_grid``: choose the rate among these on the val files first (:mod:`qkvlab.hf.rate`);
    the conversion then runs at the chosen rate as if it had been given. ``lr_tokens``: the
    budget each candidate uptrains for before it is scored (default ``hf.rate.TOKENS``).
    ``o_bases``: with ``lr_grid``, choose W_O's basis among these too (``hf.rate.choose``).
    """
    from qkvlab.env import environment
    from qkvlab.hf.cost import load_lm
    from qkvlab.progress import bar as make_bar
    from qkvlab.train.precision import autocast, resolve_precision

    started = time.monotonic()
    deadline = None if time_limit is None else started + time_limit
    corpus = pysource.fingerprint(root)
    if more_text is not None:
        corpus += "+more:" + pysource.more_fingerprint(more_text)
    u = cfg.uptrain
    cache: dict = {}

    def setup():
        if not cache:
            t0 = time.perf_counter()
            model, tok = (loaded() if callable(loaded) else loaded) if loaded else load_lm(source)
            model = model.to(device).eval()
            test = token_rows(tok, "test", cfg.eval_tokens, u.seq_len, root=root).to(device)
            calib = token_rows(tok, "train", cfg.calib_tokens, u.seq_len, root=root)
            cache.update(model=model, tok=tok, test=test, calib=calib.to(device))
            log(f"convert: {source} loaded, {cfg.eval_tokens} test tokens "
                f"({time.perf_counter() - t0:.0f} s)")
        return cache

    if o_bases and not lr_grid:
        raise ValueError("o_bases: the basis is chosen with the rate, so it needs lr_grid")
    for b in o_bases:  # refused before any candidate trains
        check_basis(parse_tie(cfg.tie)[0], cfg.start, b)
    if lr_grid:
        from qkvlab.hf.rate import choose
        lr, basis = choose(store, source, cfg, tuple(lr_grid), tuple(o_bases), setup=setup,
                           device=device, tokens=lr_tokens, corpus=pysource.fingerprint(root),
                           root=root, log=log, progress=progress)
        cfg = dataclasses.replace(cfg, uptrain=(u := dataclasses.replace(u, lr=lr,
                                                                         o_basis=basis)))
    spec = cfg.spec(source, corpus)
    if not any(r["spec"] == spec for r in store.measure_rows("convert")):
        c = setup()  # check the tie and the text before anything is stored
        kind, kv_heads = parse_tie(cfg.tie)
        if kind != "none":
            check(c["model"], kind, kv_heads, cfg.start)
        c["train"] = token_rows(c["tok"], "train", cfg.steps * u.tokens_per_step, u.seq_len,
                                skip=cfg.calib_tokens, root=root, more=more_text).to(device)
    tspec = {"model": source, "eval_tokens": cfg.eval_tokens, "seq_len": u.seq_len,
             "corpus": corpus, "version": VERSION}
    teacher_rec = store.measure("convert_teacher", tspec, lambda: _teacher(setup()),
                                env=environment())[0]

    def compute():
        c = setup()
        teacher, train = c["model"], c["train"]
        student = make_student(teacher, cfg, c["calib"])
        precision = resolve_precision(u.precision, device)
        ckpt = store.runs_dir / "convert" / _key({k: v for k, v in spec.items() if k != "tokens"})
        trainer = Uptrainer(student, teacher, train, u, ckpt, lambda: autocast(precision, device))
        if trainer.resume():
            log(f"convert: resumed at step {trainer.step} from {ckpt}")
        base_cache, base_params = footprint(teacher)
        cache_, params_ = footprint(student)
        records = {r["steps"]: r for r in trainer.state["records"]}
        bar = make_bar(total=cfg.steps * u.tokens_per_step,
                       initial=trainer.step * u.tokens_per_step, unit="tok",
                       desc=f"convert {cfg.tie}/{cfg.start}", disable=not progress)
        with bar:
            for steps in budgets(cfg):
                if steps in records:
                    continue
                if trainer.step > steps:
                    raise ValueError(f"{ckpt}: the checkpoint is at step {trainer.step}, past "
                                     f"this run's budget at step {steps}; use another store")
                t0, s0 = time.perf_counter(), trainer.step
                if not trainer.run_to(steps, bar, deadline=deadline):
                    log(f"convert: time limit of {time_limit:g} s reached at step {trainer.step} "
                        f"({trainer.step * u.tokens_per_step} tokens); checkpointed, stopping")
                    break
                train_s = time.perf_counter() - t0
                seq = sequence_nll(student, c["test"])
                rec = _record(seq, teacher_rec, cfg, steps, u.seq_len)
                rec |= {"kv_cache": cache_ / base_cache, "attn_params": params_ / base_params,
                        "precision": precision, "head_precision": trainer.head_precision,
                        "train_seconds": train_s,
                        "peak_rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
                        "peak_gpu_gb": (torch.cuda.max_memory_allocated(device) / 2**30
                                        if str(device).startswith("cuda") else None),
                        "tokens_per_s": ((steps - s0) * u.tokens_per_step / train_s
                                         if steps > s0 else None)}
                records[steps] = rec
                trainer.state["records"] = list(records.values())
                trainer.save()
                log(f"convert: {cfg.tie}/{cfg.start} at {rec['tokens']} tokens: "
                    f"ppl {rec['ppl']:.3f} "
                    f"(teacher {rec['ppl_teacher']:.3f}, gap {gap_text(rec['gap'])} "
                    f"[{gap_text(rec['gap_lo'])}, {gap_text(rec['gap_hi'])}])")
        if out:
            save_converted(student, c["tok"], out, {"source": source, "tie": cfg.tie,
                                                    "start": cfg.start, "records": len(records)})
        return [records[s] for s in budgets(cfg) if s in records]

    if deadline is None or any(r["spec"] == spec for r in store.measure_rows("convert")):
        recs = store.measure("convert", spec, compute, env=environment())
    else:
        recs = compute()
        reached = max(r["steps"] for r in recs)
        if reached == 0:
            log("convert: stopped before the first budget; nothing stored (the checkpoint "
                "resumes)")
            return recs
        if reached < cfg.steps:  # the shorter run these records are
            short = dataclasses.replace(cfg, tokens=reached * u.tokens_per_step)
            spec, recs = short.spec(source, corpus), [r for r in recs if r["steps"] <= reached]
            log(f"convert: stored as the run of {short.tokens} tokens")
        recs = store.measure("convert", spec, lambda: recs, env=environment())
    if out and not cache:  # stored already: the student is in its checkpoint folder
        _export_stored(store, spec, source, cfg, out, setup, log)
    return recs


def _teacher(c: dict) -> dict:
    seq, n = sequence_nll(c["model"], c["test"]), c["test"][:, 1:].numel()
    return {"nll_seq": seq, "nll": sum(seq) / n, "ppl": math.exp(sum(seq) / n), "eval_tokens": n}


def _record(seq: list[float], teacher: dict, cfg: ConvertConfig, steps: int, seq_len: int) -> dict:
    n = (seq_len - 1) * len(seq)
    gap, lo, hi = gap_ci(seq, teacher["nll_seq"], seq_len - 1)
    return {"tie": cfg.tie, "start": cfg.start, "steps": steps,
            "tokens": steps * cfg.uptrain.tokens_per_step, "nll": sum(seq) / n,
            "ppl": math.exp(sum(seq) / n), "ppl_teacher": teacher["ppl"], "gap": gap,
            "gap_lo": lo, "gap_hi": hi, "nll_seq": seq, "eval_tokens": n, "lr": cfg.uptrain.lr}


def _export_stored(store, spec, source, cfg, out, setup, log) -> None:
    import safetensors.torch
    c = setup()
    ckpt = store.runs_dir / "convert" / _key({k: v for k, v in spec.items() if k != "tokens"})
    student = make_student(c["model"], cfg, c["calib"])
    state = json.loads((ckpt / "state.json").read_text())
    safetensors.torch.load_model(student, ckpt / state.get("student", "student.safetensors"),
                                 strict=True)
    save_converted(student, c["tok"], out, {"source": source, "tie": cfg.tie, "start": cfg.start})
    log(f"convert: wrote {out} from the stored run's checkpoint")


__all__ = ["ConvertConfig", "TieError", "budgets", "convert", "gap_ci", "gap_text",
           "load_converted", "parse_tie", "save_converted", "token_rows"]
