"""Each question's answer as one record (``Answer``), computed from ``results.StudyData``: what
its family of headline comparisons (``plan.families``) decided after Holm's correction, what is
still open, at what scale the runs were trained, and the published number set beside it.

An effect is *decided* only when its corrected verdict (``effects.effect``) is worse, better or
equivalent; an effect whose raw verdict did not survive the correction is open, with its raw
verdict kept (``Effect.raw_status``). The scale is read from the stored runs the family's
comparisons rest on, never from the profile's settings. Nothing here formats text:
``render.answers`` words each record.
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from qkvlab.data import get_task
from qkvlab.studies.qkv.compute.effects import Effect, Status, effect
from qkvlab.studies.qkv.compute.multiplicity import members
from qkvlab.studies.qkv.compute.results import StudyData, row_chance
from qkvlab.studies.qkv.plan.families import Family
from qkvlab.studies.qkv.plan.questions import QUESTIONS
from qkvlab.studies.qkv.plan.references import (
    KAYYAM_RERUN_KV_PCT,
    KAYYAM_RERUN_WHAT,
    REF_KV_CITE,
    REF_KV_PPL_PCT,
    REF_KV_SCALE,
    REF_KV_UNIT,
)

DECIDED = (Status.WORSE, Status.BETTER, Status.EQUIVALENT)
# what one token of a text task is, by its tokenizer (``data.tokenizers.KINDS``)
TOKEN_UNIT = {"char": "character", "bpe": "subword token"}


@dataclass(frozen=True)
class Finding:
    """One headline comparison: ``design`` vs standard on ``task`` in ``arm``, its corrected
    ``effect``; ``m``: bind_codes' key and value bits where the headline reads one width;
    ``d_head``, ``init``: the head width and initialization of a headline at one width
    (scale_train's)."""

    design: str
    task: str
    arm: str
    effect: Effect
    m: int | None = None
    d_head: int | None = None
    init: str | None = None


@dataclass(frozen=True)
class Scale:
    """What the family's comparisons were trained at, read from their stored runs: the distinct
    widths, depths and step counts, standard's parameter counts (fewest, most), and the
    distinct numbers of paired seeds the effects rest on. An empty tuple: not in the store."""

    profile: str
    d_model: tuple[int, ...] = ()
    n_layers: tuple[int, ...] = ()
    params: tuple[int, ...] = ()
    steps: tuple[int, ...] = ()
    seeds: tuple[int, ...] = ()


@dataclass(frozen=True)
class Published:
    """A published number beside one of ours: ``value`` (% perplexity per ``unit``) at
    ``scale`` (``cite``); ``ours`` the finding it stands beside and ``our_unit`` what one of our
    tokens is. The numbers compare only when ``same_unit``."""

    value: float
    unit: str
    scale: str
    cite: str
    ours: Finding | None
    our_unit: str
    rerun: float | None = None  # the same authors' later corrected rerun, same unit
    rerun_what: str = ""

    @property
    def same_unit(self) -> bool:
        return self.ours is not None and self.our_unit == self.unit


@dataclass(frozen=True)
class Answer:
    """One question's answer: ``decided`` (corrected verdicts worse, better or equivalent),
    ``open`` (undecided after correction), ``not_learned`` (neither design learned the task),
    ``unused`` (standard does not beat the attention-free control: attention not used yet),
    ``not_run`` (the family's tasks this profile runs no comparison of), over ``family_m``
    comparisons corrected together; the ``scale`` and the ``published`` number, if any."""

    question: str
    family_m: int
    decided: tuple[Finding, ...]
    open: tuple[Finding, ...]
    not_learned: tuple[Finding, ...]
    not_run: tuple[str, ...]
    unused: tuple[Finding, ...]
    scale: Scale
    published: Published | None = None


def findings(data: StudyData, fam: Family) -> tuple[list[Finding], list[tuple[str, str]]]:
    """The family's comparisons at this profile (read against each task's chance level), and
    the (experiment, task) pairs they come from."""
    out, sources = [], []
    for h in fam.members:
        for row in members(data.comparisons, h).to_dict("records"):
            e = effect(row, chance=row_chance(row, data.profile))
            if e.status is Status.MISSING:
                continue
            m = row.get("m") if h.widest_m else None
            out.append(Finding(h.design, h.task, h.arm, e, None if m is None else int(m),
                               h.d_head, h.init))
            sources.append((h.experiment, h.task))
    return out, list(dict.fromkeys(sources))


def _ints(runs: pd.DataFrame, col: str) -> tuple[int, ...]:
    if col not in runs:
        return ()
    return tuple(sorted({int(v) for v in runs[col].dropna()}))


def scale(data: StudyData, sources: list[tuple[str, str]], found: list[Finding]) -> Scale:
    """The ``Scale`` of the finished runs of ``sources`` ((experiment, task) pairs)."""
    runs, seeds = data.runs, tuple(sorted({f.effect.n for f in found if f.effect.n}))
    if runs.empty or not sources or not {"experiment", "task", "status"} <= set(runs):
        return Scale(data.profile.name, seeds=seeds)
    keys = pd.MultiIndex.from_frame(runs[["experiment", "task"]])
    sel = runs[keys.isin(sources) & (runs.status == "done")]
    std = sel[sel.design == "standard"] if "design" in sel else sel.iloc[0:0]
    params = _ints(std, "n_params")
    return Scale(data.profile.name, d_model=_ints(sel, "spec.model.d_model"),
                 n_layers=_ints(sel, "spec.model.n_layers"),
                 params=(params[0], params[-1]) if params else (),
                 steps=_ints(sel, "spec.train.steps"), seeds=seeds)


def token_unit(data: StudyData, task: str) -> str:
    """What one token of a text task is in the stored runs (``TOKEN_UNIT``; the task's default
    tokenizer where the runs' spec names none), "" if unknown."""
    runs, col = data.runs, "spec.task_options.tokenizer"
    kinds = set()
    if not runs.empty and col in runs and "task" in runs:
        kinds = set(runs.loc[runs.task == task, col].dropna())
    if not kinds:
        try:
            kinds = {get_task(task, **data.profile.task_options.get(task, {})).tokenizer}
        except (ValueError, AttributeError):
            return ""
    return TOKEN_UNIT.get(kinds.pop(), "") if len(kinds) == 1 else ""


def published_kv(data: StudyData, found: list[Finding]) -> Published:
    """Kayyam et al.'s tied K=V cost beside ours on lm at equal width."""
    ours = next((f for f in found if (f.design, f.task, f.arm) == ("tied_kv", "lm", "equal")),
                None)
    return Published(REF_KV_PPL_PCT, REF_KV_UNIT, REF_KV_SCALE, REF_KV_CITE, ours,
                     token_unit(data, "lm"), KAYYAM_RERUN_KV_PCT, KAYYAM_RERUN_WHAT)


def answer(data: StudyData, question: str) -> Answer:
    """The answer to one question (``"q1"``, ``"q2"``, ``"q3"``) from the stored runs.

    Raises:
        KeyError: a question that is not one of ``plan.questions.QUESTIONS``.
    """
    fam = QUESTIONS[question.lower()].family
    found, sources = findings(data, fam)
    by = {s: [f for f in found if f.effect.status in s] for s in
          (DECIDED, (Status.UNDECIDED,), (Status.NOT_LEARNED,), (Status.ATTENTION_UNUSED,))}
    ran = {f.task for f in found}
    not_run = tuple(dict.fromkeys(h.task for h in fam.members if h.task not in ran))
    cmp = data.comparisons
    fam_m = cmp[cmp.family == fam.question].family_m if "family" in cmp else []
    m = int(max(fam_m, default=0))  # those with a p (a not-learned one too: ``correct``)
    pub = published_kv(data, found) if question.lower() == "q3" else None
    return Answer(question.lower(), m, tuple(by[DECIDED]), tuple(by[(Status.UNDECIDED,)]),
                  tuple(by[(Status.NOT_LEARNED,)]), not_run, tuple(by[(Status.ATTENTION_UNUSED,)]),
                  scale(data, sources, found), pub)


def answers(data: StudyData) -> dict[str, Answer]:
    """``{question: Answer}`` for the three questions, in order."""
    return {q: answer(data, q) for q in QUESTIONS}
