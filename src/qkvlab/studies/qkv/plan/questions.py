"""The three questions as typed records: the one place a question's comparisons are listed.

A ``Question`` holds what it asks, the thread claims it tests (``claims.CLAIMS``) and its
``rows``: each a ``Compared``, one design against standard in one experiment on some tasks.
Everything that used to list them is read from the rows:

- the experiments' runs (``designs_on``: which designs an experiment trains on a task, and in
  which arms), and the designs ``lr_tune`` tunes per task (``tuned_designs``);
- the question's family of headline comparisons, corrected together (``Question.family``,
  ``families()``: Holm over every row's tasks and arms);
- its forest plot (``Question.forest``), the summary table's sources (``summary_sources``),
  the designs whose layer and decode speed the study measures (those compared on lm).

So adding a design to a question is one row here (and, for a new design, its ``vocab.DESIGNS``
row: name, label, color, model options). The question's key (``"q1"``) is its one spelling;
the family keeps the label ``"Q1"`` it is stored under in comparisons.csv.
"""

from __future__ import annotations

from dataclasses import dataclass

from qkvlab.studies.qkv.plan.claims import CLAIMS, Claim
from qkvlab.studies.qkv.plan.families import BOTH, SCALE_D_HEADS, Family, Headline
from qkvlab.studies.qkv.plan.placements import PLACEMENTS, SCALE_INITS
from qkvlab.studies.qkv.plan.vocab import CONTROL

CHAR = ("lm_char",)  # the character-level second reading: equal width, in the family, not drawn
TUNED_TASKS = ("lm", "lm_char", "mlm", "translate")  # tasks whose rates lr_tune chooses per design


@dataclass(frozen=True)
class Compared:
    """``design`` against standard in ``experiment``, on each of ``tasks`` in ``arms`` and on
    each of ``also`` at the arms the profile runs there (``task_arms``; the family reads the
    equal arm). ``forest``: drawn in the question's forest plot (``tasks`` only). ``summary``:
    a row of the summary table. ``widest_m``/``d_head``: as ``families.Headline``.
    ``tuned``: trained at the rate ``lr_tune`` chose (scale_train's are ``scale_tune``'s)."""

    experiment: str
    design: str
    tasks: tuple[str, ...]
    arms: tuple[str, ...] = BOTH
    also: tuple[str, ...] = ()
    forest: bool = True
    summary: bool = True
    widest_m: bool = False
    d_head: int | None = None
    tuned: bool = True
    init: str | None = None

    def headlines(self) -> tuple[Headline, ...]:
        own = (Headline(self.experiment, self.design, t, a, self.widest_m, self.d_head,
                        self.init)
               for t in self.tasks for a in self.arms)
        return (*own, *(Headline(self.experiment, self.design, t) for t in self.also))


@dataclass(frozen=True)
class Question:
    """One question: its key, title, the question in full, its forest plot's title, its rows,
    and ``pooled``: experiments whose standard and control runs are the same runs, read as one
    comparison in the forest (``compute.frames.q3_lm``)."""

    key: str
    title: str
    text: str
    forest_title: str
    rows: tuple[Compared, ...]
    pooled: tuple[str, ...] = ()
    method: str = "holm"

    @property
    def label(self) -> str:
        return self.key.upper()

    @property
    def claims(self) -> list[Claim]:
        return CLAIMS[self.key]

    @property
    def family(self) -> Family:
        return Family(self.label, self.method, tuple(h for r in self.rows for h in r.headlines()))

    def forest(self) -> list[tuple[str | tuple[str, ...], str, str]]:
        """``(experiment or pooled experiments, design, task)`` per drawn row, in order."""
        return [(self.pooled if r.experiment in self.pooled else r.experiment, r.design, t)
                for r in self.rows if r.forest for t in r.tasks]

    def designs(self, experiment: str) -> tuple[str, ...]:
        """The designs this question compares in ``experiment``, in row order."""
        return tuple(dict.fromkeys(r.design for r in self.rows if r.experiment == experiment))


DIRECTED = ("successor", "successor_causal")
Q2_TASKS = ("lm", "mlm", "mqar", "relation")
EQUAL = ("equal",)

QUESTIONS: dict[str, Question] = {q.key: q for q in (
    Question(
        "q1", "Q1 — the 4th matrix and the scale",
        "Why softmax(QKᵀ/√d_k)·V and not (1/√d_k)·softmax(QKᵀ/√d_k)·V·Wᵀ with a 4th matrix W?",
        "Q1: the 4th matrix (alt) vs standard",
        (Compared("alt_vs_standard", "alt", ("lm", "translate"), also=CHAR),
         Compared("alt_init", "alt_identity", ("translate",), EQUAL, summary=False),
         *(Compared("scale_train", tag, ("lm",), EQUAL, d_head=d, forest=False, summary=False,
                    tuned=False, init=i)
           for i in SCALE_INITS for tag in PLACEMENTS if tag != "standard"
           for d in SCALE_D_HEADS))),
    Question(
        "q2", "Q2 — one matrix W = W_Q = W_K = W_V",
        "Why not one projection per head, W = W_Q = W_K = W_V, and how similar are the three "
        "in trained transformers?",
        "Q2: one matrix (tied Q=K, Q=K=V) vs standard",
        (Compared("tied_qk_qkv", "tied_qk", Q2_TASKS, also=CHAR),
         Compared("tied_qk_qkv", "tied_qk_selfmask", Q2_TASKS, also=CHAR),
         Compared("tied_qk_qkv", "tied_qkv", Q2_TASKS, also=CHAR),
         Compared("tied_qk_qkv", "tied_qkv_selfmask", Q2_TASKS, also=CHAR),
         Compared("directed_relation", "tied_qk", DIRECTED, EQUAL),
         Compared("directed_relation", "tied_qk_selfmask", DIRECTED, EQUAL),
         Compared("directed_relation", "tied_qkv_selfmask", DIRECTED, EQUAL))),
    Question(
        "q3", "Q3 — K = V",
        "Why are keys and values computed by different matrices, even for translation?",
        "Q3: K = V (and GQA, same KV cache) vs standard",
        (Compared("lm_tied_kv", "tied_kv", ("lm",), also=CHAR),
         Compared("lm_gqa", "gqa_half", ("lm",), EQUAL),
         Compared("kv_translate", "tied_kv_cross", ("translate",)),
         Compared("bind_vs_dhead", "tied_kv", ("bind_codes",), widest_m=True, summary=False)),
        pooled=("lm_tied_kv", "lm_gqa")),
)}

# Read from QUESTIONS at each call, so a question changed in place (a test adding a row)
# changes every reader at once.


def rows() -> tuple[Compared, ...]:
    """Every question's rows, in order."""
    return tuple(r for q in QUESTIONS.values() for r in q.rows)


def families() -> dict[str, Family]:
    """``{label: Family}``: each question's headline comparisons, corrected together."""
    return {q.label: q.family for q in QUESTIONS.values()}


def summary_sources() -> tuple[str, ...]:
    """The experiments whose comparisons the summary table reads, in the questions' order."""
    return tuple(dict.fromkeys(r.experiment for r in rows() if r.summary))


def designs_on(experiment: str) -> dict[str, tuple[tuple[str, ...], tuple[str, ...] | None]]:
    """``{task: (designs, arms)}`` that ``experiment`` trains, from the rows: ``arms`` is the
    rows' when they all name only the equal arm, else None (the profile's ``task_arms``)."""
    out: dict[str, tuple[list[str], set]] = {}
    for r in rows():
        if r.experiment != experiment:
            continue
        for t in (*r.tasks, *r.also):
            designs, arms = out.setdefault(t, ([], set()))
            designs.append(r.design)
            arms.add(r.arms if t in r.tasks else None)
    return {t: (tuple(dict.fromkeys(d)), EQUAL if a == {EQUAL} else None)
            for t, (d, a) in out.items()}


def tuned_designs(experiments: tuple[str, ...] = ()) -> dict[str, tuple[str, ...]]:
    """``{task: designs}`` whose rate ``lr_tune`` chooses, the control last: every design a
    tuned row compares on a ``TUNED_TASKS`` task (only rows of ``experiments`` where that is
    given: a profile that runs only those). The control is tuned like the others: at an
    untuned rate it would be a weaker baseline, and standard would "use attention" by the
    rate alone."""
    return {t: (*dict.fromkeys(r.design for r in rows() if r.tuned and t in (*r.tasks, *r.also)
                               and (not experiments or r.experiment in experiments)),
                CONTROL) for t in TUNED_TASKS}


def equal_only() -> frozenset[str]:
    """Designs every tuned row compares at equal width only (no matched-width rate), and the
    control."""
    arms: dict[str, set] = {}
    for r in rows():
        if r.tuned:
            arms.setdefault(r.design, set()).add(r.arms)
    return frozenset({d for d, a in arms.items() if a == {EQUAL}} | {CONTROL})
