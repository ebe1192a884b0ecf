"""The families of headline comparisons, one per question, and how each is corrected for
multiplicity: written down before the runs, like the margins (``vocab.METRICS``). Each
question's family is read from its rows (``questions.Question.family``, ``questions.FAMILIES``).

A family is every comparison its question's headline sentence and the summary table may call
decided: design vs ``standard`` on a task's own metric (``vocab.TASK_METRIC``) in one arm.
Its verdicts are corrected together (``compute.multiplicity``): Holm's step-down at ``ALPHA``
over the p of the test that decided each raw verdict. Each comparison enters once: its two
nulls (no difference; a difference of at least the margin) cannot both be true. A member the
profile does not run is not in its family at that profile; one that reads "not learned" still
counts (choosing members after seeing the runs would not be planned; it only makes the
correction stricter), and so does one that reads "attention not used at this budget"
(standard does not beat the attention-free control: ``compute.effects``). What lies outside
the families (the
evidence tables' other metrics, the scaling widths, the detail sentences) is tested at 5% each
and the legend says so.

The character-level lm (``lm_char``, bits per character, equal width) is in its question's family
beside the headline lm: its verdicts sit in the same tables and sentences and could be quoted as
claims, so leaving them out would let a second reading of the same question be called decided
at 5% uncorrected. It makes each family larger, so the correction is more conservative for the
headline cells too; that is the price of reporting the second row.

Why Holm and not Benjamini–Hochberg: each headline verdict is quoted on its own as a claim
("tied Q=K costs X on relation"), so the error to bound is that of any one claim being false,
the family-wise rate, not the share of false ones among many; Holm bounds it whatever the
dependence between the tests (they share the standard runs) and rejects everything
Bonferroni rejects, and more.

Rule for a lost run (a diverged or failed one), also fixed before the runs: it enters its
comparison as the worst outcome, at the task's chance level (guessing accuracy, or a
context-free guess's val loss) or at the worst value any finished run of its comparison
reached, whichever is worse (``stats.compare``); it is never dropped, and its cell says so.
"""

from __future__ import annotations

from dataclasses import dataclass

from qkvlab.studies.qkv.plan.profiles import PROFILES
from qkvlab.studies.qkv.plan.vocab import TASK_METRIC

ALPHA = 0.05  # the family-wise error rate each question's headline verdicts keep


REASON = ("each headline verdict is quoted as a claim on its own, so the family-wise error "
          "rate is bounded (Holm: valid under any dependence, never weaker than Bonferroni)")


@dataclass(frozen=True)
class Headline:
    """One headline comparison: ``design`` vs standard in ``experiment`` on ``task``'s own
    metric, in ``arm``. ``widest_m``: bind_codes at its largest m and d_head = m, where standard
    has just the width the task needs (the summary table's point). ``d_head``, ``init``: the
    comparison at that head width and initialization only (scale_train: one cell per
    placement, width and init)."""

    experiment: str
    design: str
    task: str
    arm: str = "equal"
    widest_m: bool = False
    d_head: int | None = None
    init: str | None = None

    @property
    def metric(self) -> str:
        return TASK_METRIC[self.task]


@dataclass(frozen=True)
class Family:
    """A question's headline comparisons and how their verdicts are corrected together."""

    question: str
    method: str
    members: tuple[Headline, ...]
    reason: str = REASON


BOTH = ("equal", "matched")
# Q1's trained scale: each placement vs inside (standard) at every head width a profile trains
SCALE_D_HEADS = tuple(sorted({d for p in PROFILES.values() for d in p.scale_train_d_heads}))
