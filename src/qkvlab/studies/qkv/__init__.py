"""The three questions' study: why attention is softmax(QKᵀ/√d_k)·V with three projections.

Importing it registers its experiments and profiles (``experiments.py``); ``run_study`` runs
(or reuses) every experiment and measure and writes the report. ``qkvlab study`` finds it
through the ``qkvlab.studies`` entry point (``configure``/``run`` below) and it uses the
library like any user would; nothing in the library imports it.

    experiments.py  profiles and the experiments behind each claim
    measures.py     what is measured besides training, one function each (records)
    study.py        the study: sweeps, measures, pretrained analysis, then the report
    results.py      the store read back as tidy DataFrames (StudyData)
    verdicts.py     verdict sentences and words from the numbers and their CIs
    figures.py      one function per figure (PNG, SVG, CSV)
    page.py         the page as typed blocks (qkvlab.report.blocks)
    claims.py       the threads' claims, quoted, and what tests each
"""

from qkvlab.studies.qkv import experiments  # noqa: F401  (registers experiments and profiles)
from qkvlab.studies.qkv.cli import HELP, configure, run

__all__ = ["HELP", "configure", "run"]
