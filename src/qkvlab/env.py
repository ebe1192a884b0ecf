"""PLACEHOLDER until the util branch lands."""
from qkvlab.experiments.runner import environment  # noqa: F401
