"""The answers first: one short paragraph per question, in plain words, worded from the
``compute.answers.Answer`` records: what is decided (after Holm's correction over the
question's comparisons), at what scale, in which unit, how it compares with the published
number, and what is still open. Formats records; computes nothing.
"""

from __future__ import annotations

import dataclasses

from qkvlab.report.blocks import Block, Para, Section
from qkvlab.studies.qkv.compute.answers import Answer, Finding, Published, Scale, answers
from qkvlab.studies.qkv.compute.effects import Effect, Status, attention_used, effect
from qkvlab.studies.qkv.compute.results import StudyData
from qkvlab.studies.qkv.plan.placements import INIT_WORDS
from qkvlab.studies.qkv.plan.questions import QUESTIONS
from qkvlab.studies.qkv.plan.references import REF_KV_CHARS_PER_TOKEN, per_char
from qkvlab.studies.qkv.plan.vocab import ARMS, CONTROL, LM_CHARS_PER_TOKEN, label
from qkvlab.studies.qkv.render.convert import convert_sentence
from qkvlab.studies.qkv.render.headwidth import head_width_answer
from qkvlab.studies.qkv.render.text import and_list
from qkvlab.studies.qkv.render.uptrain import uptrain_answer
from qkvlab.studies.qkv.render.figures_scaling import answer_sentence

# a task in plain words (its name in the tables after it, on first mention)
TASK_WORDS = {"lm": "text prediction", "lm_char": "text prediction by character",
              "mlm": "masked-text prediction",
              "translate": "translation", "relation": "induction",
              "mqar": "associative recall", "successor": "an order set by content, encoder",
              "successor_causal": "an order set by content, decoder",
              "bind_codes": "recalling a value bound to a key"}
UNIT_WORDS = {"pp": "percentage points of", "bits/char": "bits per character"}
VERDICT = {Status.WORSE: "worse than", Status.BETTER: "better than",
           Status.EQUIVALENT: "as good as"}


class _Tasks:
    """Names tasks in plain words, with the table's name beside the first mention."""

    def __init__(self) -> None:
        self.seen: set[str] = set()

    def __call__(self, task: str) -> str:
        words = TASK_WORDS.get(task)
        if words is None or task in self.seen:
            return words or task
        self.seen.add(task)
        return f"{words} ({task})"


def amount(e: Effect) -> str:
    """``+1.9 ± 2.2% perplexity``, ``-78.0 ± 5.6 percentage points of accuracy``: the effect
    and half its 95% CI in the unit people quote."""
    if e.value is None:
        return "no number"
    unit, n = e.unit.strip(), e.digits
    tail = f"% {e.what}" if unit == "%" else f" {UNIT_WORDS.get(unit, unit)} {e.what}".rstrip()
    if e.half is None:
        return f"{e.value:+.{n}f}{tail}, from one seed"
    return f"{e.value:+.{n}f} ± {e.half:.{n}f}{tail}"


def _arm(arm: str) -> str:
    return f"at {ARMS[arm]}" if arm == "equal" else ARMS.get(arm, arm)


def _where(f: Finding, task) -> str:
    width = f" at m = d_head = {f.m}" if f.m is not None else \
        f" at d_head {f.d_head}" if f.d_head is not None else ""
    if f.init is not None:
        width += f" from {INIT_WORDS.get(f.init, f.init)}"
    return f"on {task(f.task)}{width} {_arm(f.arm)}"


def _decided(f: Finding, task) -> str:
    e = f.effect
    within = f", within the {e.margin.replace('pp', 'points')} set before the runs" \
        if e.status is Status.EQUIVALENT else ""
    return (f"{label(f.design)} is {VERDICT[e.status]} standard {_where(f, task)} "
            f"({amount(e)}{within})")


def _named(name: str, task) -> str:
    """A task, or ``task|arm`` with its arm."""
    t, _, arm = name.partition("|")
    return task(t) if not arm else f"{task(t)} {_arm(arm)}"


def _open(a: Answer, task) -> str:
    """The open comparisons: those the correction undid with their numbers and raw verdict,
    the others by name (both widths in one), and the seeds that would settle them."""
    near = [f for f in a.open if f.effect.raw_status is not None]
    out = []
    if near:
        out.append(f"Still open, though each would be decided on its own, without the "
                   f"correction for all {a.family_m}: " + "; ".join(
                       f"{label(f.design)} {_where(f, task)}, {f.effect.raw_status.value} "
                       f"({amount(f.effect)})" for f in near) + ".")
    rest: dict[str, list[str]] = {}
    for f in a.open:  # the arm is named where another arm's verdict is quoted
        quoted = any((g.design, g.task) == (f.design, f.task)
                     for g in (*a.decided, *near, *a.not_learned))
        name = f"{f.task}|{f.arm}" if quoted else f.task
        if f not in near and name not in rest.setdefault(f.design, []):
            rest[f.design].append(name)
    if rest:
        names = "; ".join(f"{label(d)} on {and_list([_named(t, task) for t in ts])}"
                          for d, ts in rest.items() if ts)
        out.append(("Undecided outright: " if near else "Still open: ") + names + ".")
    seeds = sorted(f.effect.seeds for f in a.open if f.effect.seeds)
    if seeds:
        n = f"{seeds[0]}" if seeds[0] == seeds[-1] else f"{seeds[0]} to {seeds[-1]}"
        out.append(f"About {n} seeds per comparison would settle them.")
    return " ".join(out)


def _span(xs: tuple[int, ...], fmt: str = "{:,}") -> str:
    return fmt.format(xs[0]) if xs[0] == xs[-1] else f"{fmt.format(xs[0])}–{fmt.format(xs[-1])}"


def scale_words(s: Scale) -> str:
    """"Scale: ..." of the stored runs, each part only where the store has it."""
    parts = []
    if s.d_model:
        parts.append(f"models {_span(s.d_model)} wide")
    if s.n_layers:
        parts.append(f"{_span(s.n_layers)} layer{'' if s.n_layers == (1,) else 's'} deep")
    if s.params:
        parts.append(f"{_span(s.params)} parameters (standard)")
    if s.steps:
        parts.append(f"trained for {_span(s.steps)} steps")
    if s.seeds:
        parts.append(f"{_span(s.seeds)} seed{'' if s.seeds == (1,) else 's'} per comparison")
    return f"Scale: the {s.profile} profile" + (f", {', '.join(parts)}." if parts else ".")


def published_words(p: Published) -> str:
    """The published number beside ours: compared only in the same unit."""
    head = (f"Published ({p.cite}): tied K=V costs +{p.value:g}% perplexity per {p.unit} at "
            f"{p.scale}" + (f" (+{p.rerun:g}% in their {p.rerun_what})" if p.rerun else ""))
    if p.ours is None:
        return head + "; this profile has no comparison of ours to set beside it."
    if p.ours.effect.value is None:  # not learned: no number of ours to set beside it
        return head + "; ours is not learned at this scale, so there is no number to set beside it."
    if p.ours.effect.status is Status.ATTENTION_UNUSED:  # a gap of models that use no attention
        return (head + f"; ours ({amount(p.ours.effect)} at equal width) is not set beside it: "
                "at this budget standard does not beat the same model without attention, so "
                "the difference says nothing about what the tie costs.")
    ours = f"ours, {amount(p.ours.effect)} at equal width, is per {p.our_unit or 'token'}"
    if p.same_unit:
        return f"{head}; {ours} too, at a far smaller scale{_per_char(p)}."
    return f"{head}; {ours}, a different unit, so the two numbers are not compared."


def _per_char(p: Published) -> str:
    """Both per-token numbers per character, since their tokens span more characters than
    ours (a per-token ratio r is r^(1/c) per character at c characters a token)."""
    e = p.ours.effect
    if p.unit != "subword token" or e.unit.strip() != "%" or e.value is None:
        return ""
    theirs = per_char(p.value, REF_KV_CHARS_PER_TOKEN)
    return (f" (per character: theirs +{theirs:.2f}% at ~{REF_KV_CHARS_PER_TOKEN:g} characters "
            f"a token, ours {per_char(e.value, LM_CHARS_PER_TOKEN):+.2f}% at "
            f"{LM_CHARS_PER_TOKEN:g})")


def answer_text(a: Answer, others: bool = False) -> str:
    """One question's answer as a paragraph; ``others``: after a lead that worded some of its
    comparisons (``without_widths``), so the rest are "the other" ones."""
    task = _Tasks()
    if a.decided:
        out = (f"Decided{' besides' if others else ''}, after correcting for the {a.family_m} "
               f"comparisons this question asks: "
               f"{'; '.join(_decided(f, task) for f in a.decided)}.")
    elif others:
        out = (f"None of the other comparisons is decided after correcting for the "
               f"{a.family_m} this question asks.")
    elif a.family_m or a.not_learned or a.open or a.unused:
        out = (f"Nothing is decided yet: no comparison holds after correcting for the "
               f"{a.family_m} this question asks.")
    else:
        out = "No comparison of this question has finished runs at this profile."
    out += " " + scale_words(a.scale)
    if a.published is not None:
        out += " " + published_words(a.published)
    if a.open:
        out += " " + _open(a, task)
    if a.not_learned:
        tasks = [task(t) for t in dict.fromkeys(f.task for f in a.not_learned)]
        out += (f" Not learned at this scale, so not answered: {and_list(tasks)} (neither design "
                f"got clearly past guessing).")
    if a.unused:
        tasks = [task(t) for t in dict.fromkeys(f.task for f in a.unused)]
        out += (f" Attention not used at this budget, so not answered: {and_list(tasks)} (standard "
                f"does not beat the same model with uniform attention by more than the margin).")
    if a.not_run:
        out += f" Not run at this profile: {and_list([task(t) for t in a.not_run])}."
    return out


def without_widths(a: Answer) -> Answer:
    """``a`` without its findings at one head width (scale_train's cells), for a paragraph
    that a lead sentence words them in; the correction still counts them (``family_m``)."""
    def keep(fs: tuple[Finding, ...]) -> tuple[Finding, ...]:
        return tuple(f for f in fs if f.d_head is None)
    return dataclasses.replace(a, decided=keep(a.decided), open=keep(a.open),
                               not_learned=keep(a.not_learned), unused=keep(a.unused))


def answer_blocks(data: StudyData, lead: dict[str, str] | None = None) -> list[Block]:
    """The section that opens the report: a paragraph per question, titled as its section;
    ``lead``: a question's opening words (Q1: where 1/√d_k sits, from ``render.scale``), which
    word its per-width findings."""
    out: list[Block] = [Section("answers", "The answers")]
    at_scale = answer_sentence(data)
    converted = {q: convert_sentence(data, q) for q in ("q2", "q3")}
    if data.comparisons.empty and at_scale:  # a profile of the scaling experiments alone
        return [*out, Para(f"Profile {data.profile.name} trains only the gap of each tie "
                           f"against training budget and model size (the quick and standard "
                           f"profiles answer Q1–Q3 at one size). {at_scale}")]
    if data.comparisons.empty and any(converted.values()):  # a profile of conversions alone
        return [*out, Para(f"Profile {data.profile.name} only converts trained decoders to a "
                           f"tie and uptrains them (the quick and standard profiles answer "
                           f"Q1–Q3 from scratch). {convert_sentence(data, None)}")]
    for q, a in answers(data).items():
        first = (lead or {}).get(q)
        text = f"{first} {answer_text(without_widths(a), True)}" if first else answer_text(a)
        if q.lower() == "q2" and converted["q2"]:
            text += " " + converted["q2"]
        if q.lower() == "q3":
            text += "".join(" " + t for t in (converted["q3"], uptrain_answer(data),
                                                head_width_answer(data), kv_elsewhere(data))
                            if t)
        out.append(Para(f"{QUESTIONS[q].title}. {text}"))
    if at_scale:
        out.append(Para(at_scale))
    smoke = headline_smoke(data)
    if smoke:
        out.append(Para(smoke))
    return out


def kv_elsewhere(data: StudyData) -> str:
    """Standard's pointer to what it no longer runs itself: K=V's head-width axis and the
    controlled conversion of its lm are the kv profile's, on the same runs."""
    if data.profile.name != "standard" or data.profile.head_width_cells:
        return ""
    return ("K=V's cost at other head widths, and converting this lm to K=V and training it "
            "on, are answered by the kv profile on the same lm runs (`make report "
            "PROFILE=kv`).")


def headline_smoke(data: StudyData) -> str:
    """Said plainly where the headline lm does not use attention at this profile's budget
    (lm_tied_kv's control row, ``effects.attention_used``): its rows are a smoke test."""
    rows = data.compared("lm_tied_kv", task="lm", design=CONTROL, arm="equal", metric="val_loss")
    if rows.empty or attention_used(rows.iloc[0].to_dict()) is not False:
        return ""
    e, p = effect(rows.iloc[0].to_dict()), data.profile
    steps = p.task_train.get("lm", {}).get("steps", p.steps)
    half = "" if e.half is None else f" ± {e.half:.{e.digits}f}"
    return (f"At this profile the headline lm ({steps:,} steps, d_model {p.d_model}, "
            f"{p.n_heads} heads) does not use attention: the attention-free control is "
            f"{e.value:+.{e.digits}f}{half}{e.unit} per token against standard, not clearly "
            f"behind it. Its comparisons at that size read no verdict and are a smoke test of the "
            f"pipeline, not an answer; the standard profile (`make report PROFILE=standard`) "
            f"trains lm longer on more seeds.")
