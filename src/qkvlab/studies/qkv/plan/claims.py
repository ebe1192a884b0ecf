"""The claims made in the three Stack Exchange threads (``../shared/seeds/``), quoted short.

Each claim is a phrase copied verbatim from its seed file (CC BY-SA, quoted with attribution)
and the experiment of this study that tests it. At run time the phrases are checked against
the seed files when they are present (``QKVLAB_SEEDS``, else ``../shared/seeds`` next to the
checkout or the working directory); otherwise the copies below are used and the report says so.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

THREADS = {
    "001": "“Why is attention asymmetric between (Q, K) and V?” (Stack Exchange, seed 001)",
    "003": "“Why shouldn't the attention matrices W^Q, W^K, W^V be the same?” "
           "(Stack Exchange, seed 003)",
    "004": "“Why K and V are not the same in Transformer attention?” (Stack Exchange, seed 004)",
}
LICENSE = "Stack Exchange content, CC BY-SA; quoted verbatim, short phrases only."

@dataclass(frozen=True)
class Claim:
    seed: str
    quote: str
    tested_by: str


CLAIMS: dict[str, list[Claim]] = {
    "q1": [
        Claim("001", "the scaling constant needs to go inside the softmax",
              "scale probe: entropy, saturated rows and ‖∇W_Q‖ vs d_k for each placement"),
        Claim("001", "you might vanishing the gradients", "scale probe: ‖∇W_Q‖ at init vs d_k"),
        Claim("001", "I'm not sure the design is really all that different from what you propose",
              "fold_alt: alt folded into standard's W_O, logits compared"),
        Claim("001", "we tried, it's slower and not more accurate",
              "alt_vs_standard on lm and translate: loss ± CI, tokens/s, layer time"),
        Claim("001", "the result is just a convex combination of values",
              "share of head outputs outside the values' range, standard vs alt"),
    ],
    "q2": [
        Claim("003", "why we need three different matrices",
              "tied_qk_qkv: tied Q=K and Q=K=V (each ± self-mask) vs standard on lm, mlm, "
              "mqar, relation"),
        Claim("003", "one attention head is responsible for one syntactic or semantic relation",
              "directed_relation: tied Q=K (± self-mask) and Q=K=V + self-mask vs standard on "
              "a relation between contents, encoder and decoder"),
        Claim("003", "is also a way to save model parameters",
              "the parameter-matched arm: the tied design widened to standard's parameters"),
        Claim("003", "only sometimes symmetric",
              "attention to a token's own position; symmetry s of W_QK"),
        Claim("003", "How similar are the three matrices of an attention head in practice",
              "pretrained MiniLM, Whisper tiny, SmolLM2: symmetry and subspace overlaps vs null"),
        Claim("001", "isn't symmetric with regard to encoder and decoder blocks",
              "symmetry_emergence: encoder (mlm) vs decoder (lm) from the same init"),
    ],
    "q3": [
        Claim("004", "for translation task K should be the same with V",
              "kv_translate: tied K=V in cross-attention vs standard"),
        Claim("004", "the values for \"neural\" and \"social\" should be dissimilar",
              "bind_vs_dhead: one token carries a key and a value feature"),
        Claim("004", "you'll lose a lot of expressiveness and might need much more parameters",
              "lm_tied_kv at equal width and parameter-matched; bind vs d_head"),
    ],
}


def seeds_dir() -> Path | None:
    """The folder of the seed threads, if one is reachable."""
    here = Path(__file__).resolve()
    candidates = [os.environ.get("QKVLAB_SEEDS"), Path.cwd().parent / "shared" / "seeds",
                  here.parents[4].parent / "shared" / "seeds"]
    for c in candidates:
        if c and Path(c).is_dir():
            return Path(c)
    return None


def _norm(s: str) -> str:
    return re.sub(r"\s+", " ", s.replace("’", "'")).strip().lower()


def resolved_claims() -> tuple[dict[str, list[dict]], str]:
    """Claims per question with ``source`` (the seed file, or the shipped copy) and a note."""
    folder = seeds_dir()
    texts: dict[str, str] = {}
    if folder is not None:
        for f in sorted(folder.glob("*.txt")):
            texts[f.name[:3]] = _norm(f.read_text(errors="replace"))
    out: dict[str, list[dict]] = {}
    for q, claims in CLAIMS.items():
        for c in claims:
            found = c.seed in texts and _norm(c.quote) in texts[c.seed]
            out.setdefault(q, []).append({"seed": c.seed, "quote": c.quote,
                                          "tested_by": c.tested_by,
                                          "thread": THREADS[c.seed], "verified": found})
    note = (f"Quotes checked against {folder}." if folder is not None and texts
            else "Seed threads not found on this machine: quotes are qkvlab's shipped copies.")
    return out, f"{note} {LICENSE}"
