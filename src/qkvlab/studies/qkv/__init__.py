"""The three questions' study: why attention is softmax(QKᵀ/√d_k)·V with three projections.

Three layers, imports flowing one way: ``plan`` (what is decided before any run: designs and
metrics with their margins, profiles, learning-rate policy, published references, experiments,
the threads' claims), ``compute`` (what is computed from the results store: measures, the
store as tidy frames, effects and verdicts as typed records, derived tables) and ``render``
(sentences, tables, figures, the page). ``study.run_study`` runs it all; importing this package
registers the experiments and profiles, and ``qkvlab study`` finds it through the
``qkvlab.studies`` entry point (``configure``/``run``). It uses the library like any user
would; nothing in the library imports it.
"""

from qkvlab.studies.qkv.cli import HELP, configure, run
from qkvlab.studies.qkv.plan import experiments  # noqa: F401  (registers experiments and profiles)

__all__ = ["HELP", "configure", "run"]
