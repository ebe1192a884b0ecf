"""Published numbers the study sets beside its own, each with its source and the unit it was
measured in. They are reference values only: nothing here is measured by qkvlab, and a figure
or sentence that draws one labels it as published.
"""

from __future__ import annotations

# Tied K=V costs about +3.1% perplexity (per subword token) at 300M–1.2B parameters.
REF_KV_PPL_PCT = 3.1
REF_KV_CITE = "Kayyam et al. 2026, arXiv 2606.04032"

# chrF at which a translation comparison compares translators whose output carries meaning.
TRANSLATE_CHRF_AIM = 30

# (zoo family, role) -> the published model (``qkvlab.analysis.measures.PUBLISHED_SYMMETRY``)
# its whole-layer symmetry is compared with. MPNet is BERT-base's size and objective family;
# every causal decoder against the decoders Saponati et al. measured.
PUBLISHED_MATCH = {("bert", "encoder"): "BERT-base", ("mpnet", "encoder"): "BERT-base",
                   ("llama", "decoder"): "Llama-3-8B", ("qwen2", "decoder"): "Llama-3-8B",
                   ("gemma3", "decoder"): "Llama-3-8B"}
