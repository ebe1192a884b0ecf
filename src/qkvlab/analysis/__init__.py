"""Analysis of W_Q, W_K, W_V in pretrained and qkvlab checkpoints.

One loader per family maps a checkpoint onto the per-head view (:mod:`.heads`); the measures
(:mod:`.measures`) are gauge-invariant and each comes with a random null; :func:`analyze`
writes the tables and figures.
"""

from qkvlab.analysis.heads import LayerView, ModelView, from_attention
from qkvlab.analysis.run import analyze
from qkvlab.analysis.sources import BUILTINS, resolve

__all__ = ["BUILTINS", "LayerView", "ModelView", "analyze", "from_attention", "resolve"]
