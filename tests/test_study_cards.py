"""The answer cards' words (render.cards) follow the facts compute.cards decided, and say
nothing those facts do not carry."""

from qkvlab.studies.qkv.compute.cards import Card, Number
from qkvlab.studies.qkv.render.cards import number_text, open_text, sentence


def card(q, facts, numbers=(), open_=0, asked=7, settle="standard"):
    return Card(q, tuple(numbers), facts, open_, asked, settle, "")


def test_q3_says_what_the_cache_bytes_and_the_conversion_measured():
    lead, more = sentence(card("q3", {"cache_ratio": 0.5, "cache_halved": True,
                                      "zero_shot": 6.16, "converted_tokens": 262144,
                                      "converted_gap": 2.94, "decided": 0}))
    assert lead == "K=V halves the KV cache; imposed on a trained model it multiplies " \
                   "perplexity by ×6.16."
    assert more.startswith("After 262,144 tokens of uptraining the converted model is at ×3.94")
    assert "No trained comparison of this question is decided yet from scratch." in more
    lead, _ = sentence(card("q3", {"cache_ratio": 0.75, "cache_halved": False, "decided": 1}))
    assert "halves" not in lead and "×0.75" in lead


def test_q1_claims_the_fold_only_where_it_is_exact_and_flags_the_surprise():
    lead, more = sentence(card("q1", {"fold_exact": True, "saturates": True,
                                      "trained_better": [("outside", 64, "gpt2")],
                                      "decided": 1}))
    assert "not expressivity" in lead
    assert "rows saturate at init" in more
    assert "outside at d_head 64 from the model's own init (std 0.02) was decided better" in more
    assert "why is open (from the model's small init that saturation may never arise)" in more
    # from unit variance the saturation can arise, so the small init is no reason there
    _, more = sentence(card("q1", {"fold_exact": True, "trained_better": [
        ("outside", 64, "gpt2"), ("both", 16, "unit")], "decided": 2}))
    assert ("outside at d_head 64 from the model's own init (std 0.02), 1/√d_k inside and "
            "outside at d_head 16 from a unit-variance init (std 1/√d_model) were decided "
            "better than the scale inside; why is open.") in more
    lead, more = sentence(card("q1", {"fold_exact": False, "decided": 0}))
    assert "not expressivity" not in lead and "saturate" not in more


def test_q2_names_the_worse_comparisons_and_the_symmetric_stacks():
    worse = Number("tied_qkv vs standard on relation", -86.4, " pp", "3 seeds", "worse",
                   -92.4, -80.4)
    lead, more = sentence(card("q2", {"symmetric_models": 4, "models": 5, "decided": 1},
                               [worse]))
    assert "decided worse" in lead and "relation" in lead
    assert more.startswith("In 4 of 5 pretrained attention stacks")
    assert number_text(worse) == "-86.4 pp (95% CI -92.4 pp to -80.4 pp; worse; 3 seeds)"
    lead, _ = sentence(card("q2", {"decided": 0}))
    assert lead == "Sharing one matrix is not decided worse at this profile."


def test_open_names_the_profile_that_settles_it():
    assert open_text(card("q3", {}, open_=0)) == ""
    text = open_text(card("q3", {}, open_=5, asked=7))
    assert text.startswith("5 of the 7 comparisons") and "PROFILE=standard" in text
    assert "PROFILE" not in open_text(card("q3", {}, open_=5, settle=""))
