"""A study measure end to end: computed on a real checkpoint, stored next to its run, read back
by ``results.load`` and shown in the page's table (the recipe of DEVELOPERS.md)."""

from __future__ import annotations

import numpy as np
import torch

from qkvlab import ModelConfig, build_model, save_model
from qkvlab.experiments.store import Store
from qkvlab.studies.qkv.compute import measures, results
from qkvlab.studies.qkv.render import tables

T975_DF1 = 12.706204736174707  # Student t, 97.5% quantile, 1 degree of freedom


def test_weight_similarity_is_stored_with_its_run_and_tabulated(tmp_path):
    with Store(tmp_path / "r.db") as store:
        means = []
        for seed in (0, 1):
            torch.manual_seed(seed)
            path = tmp_path / f"m{seed}.safetensors"
            save_model(build_model(ModelConfig(d_vocab=40, n_ctx=16, d_model=32, n_layers=1,
                                               n_heads=2), "decoder"), path)
            spec = {"task": "lm", "model": {"d_model": 32}, "train": {"seed": seed}}
            rid, = store.add("tied_qk_qkv", "smoke", [(spec, {"task": "lm", "design": "standard",
                                                              "arm": "equal", "seed": seed})])
            recs = store.measure("weight_similarity", {"run": rid, "profile": "smoke"},
                                 lambda path=path: measures.weight_similarity(path, 16), run=rid)
            assert {r["measure"] for r in recs} >= set(tables.SIMILARITY)
            means.append({r["measure"]: r["mean"] for r in recs})
        data = results.load(store, "smoke")
    ws = data.measure("weight_similarity")
    assert set(ws.seed) == {0, 1} and set(ws.task) == {"lm"}  # tags joined from the run
    (table,) = tables.weight_similarity_table(data)
    (row,) = table.rows
    assert row[:3] == ("lm", "decoder", "2")
    sym = np.array([m["symmetry"] for m in means])
    half = T975_DF1 * sym.std(ddof=1) / np.sqrt(2)
    assert row[3].startswith(f"{sym.mean():.3g} ± {half:.3g} (null ")


def test_only_the_current_version_of_a_measure_is_read():
    """A store keeps the records of earlier measure versions beside the recomputed ones; the
    report reads each measure once, at the versions its code stores now."""
    import pandas as pd

    from qkvlab.analysis.run import SUMMARY_VERSION
    from qkvlab.studies.qkv.compute.measures import MEASURE_VERSION

    df = pd.DataFrame({"spec.version": [MEASURE_VERSION - 1, MEASURE_VERSION, MEASURE_VERSION],
                       "spec.summary_version": [SUMMARY_VERSION, None, SUMMARY_VERSION]})
    assert results.current(df, "pretrained").tolist() == [False, False, True]
    assert results.current(df, "fold_alt").tolist() == [False, True, True]
    assert results.current(pd.DataFrame({"x": [1]}), "pretrained").tolist() == [True]
