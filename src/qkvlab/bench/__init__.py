"""Side-by-side speed benchmarks of qkvlab, reported as ratios measured in one run.

Absolute times on a shared machine mean little; every figure here is a ratio against a peer
(``peers``: HF GPT-2, x-transformers, litgpt, nanoGPT, each against qkvlab under its settings)
or against ``standard`` attention, measured interleaved (``qkvlab.timing``: round-robin over
the contenders, median over rounds) so that machine noise hits all contenders alike.
``qkvlab bench`` runs them all (``run.run_bench``) and prints ``tables.bench_tables``. The
library's own speed measurements, which the study also stores, are in ``qkvlab.models.speed``;
the bench sits above them and nothing in the library imports it.
"""
