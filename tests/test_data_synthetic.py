"""Synthetic tasks (mqar, bind, bind_codes, relation, successor, successor_causal): generators
checked against brute-force answers,
determinism, option errors, and (slow) that a tiny model learns them above chance."""

from __future__ import annotations

import pytest
import torch

from qkvlab.data import IGNORE, TASKS, get_task
from qkvlab.models import KINDS, ModelConfig

SYNTHETIC = ("mqar", "bind", "bind_codes", "relation", "successor", "successor_causal")
SMALL = {
    "mqar": {"seq_len": 32, "vocab": 32, "n_pairs": 4},
    "bind": {"n_keys": 16, "n_values": 8, "group_size": 4, "n_items": 10, "n_queries": 3, "n_near": 2},
    "bind_codes": {"m": 3, "n_items": 6, "n_queries": 3},
    "relation": {"vocab": 20, "n_context": 10, "n_queries": 6},
    "successor": {"vocab": 20, "n_items": 7},
    "successor_causal": {"vocab": 20, "n_items": 7},
}


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def brute_mqar(task, idx: torch.Tensor) -> torch.Tensor:
    """Targets from the rule alone: every reappearance of a context key after the context is a
    query, answered by the token that followed the key in the context."""
    out = torch.full_like(idx, IGNORE)
    ctx = 2 * task.n_pairs
    for b in range(idx.shape[0]):
        row = idx[b].tolist()
        kv = {row[j]: row[j + 1] for j in range(0, ctx, 2)}
        for t in range(ctx, len(row)):
            if row[t] in kv:
                out[b, t] = kv[row[t]]
    return out


def brute_bind(task, idx: torch.Tensor) -> torch.Tensor:
    out = torch.full_like(idx, IGNORE)
    for b in range(idx.shape[0]):
        items = [divmod(int(x), task.n_values) for x in idx[b, :task.n_items]]
        for t in range(task.n_items, task.seq_len):
            k = int(idx[b, t]) - task.query_base
            matches = [v for key, v in items if key == k]
            assert len(matches) == 1  # exactly one item carries the queried key
            out[b, t] = task.answer_base + matches[0]
    return out


def brute_bind_codes(task, idx: torch.Tensor) -> torch.Tensor:
    """Items (k, v) with distinct keys, then queries of distinct keys among them, each answered
    by its item's value."""
    out, n = torch.full_like(idx, IGNORE), 2 ** task.m
    for b in range(idx.shape[0]):
        items = dict(divmod(int(x), n) for x in idx[b, :task.n_items])
        assert len(items) == task.n_items  # distinct keys
        queried = [int(x) - task.query_base for x in idx[b, task.n_items:]]
        assert len(set(queried)) == len(queried) and set(queried) <= set(items)
        for t, k in enumerate(queried, start=task.n_items):
            out[b, t] = task.answer_base + items[k]
    return out


def brute_relation(task, idx: torch.Tensor) -> torch.Tensor:
    """At every position whose token occurred before: the token after (or before) its most
    recent previous occurrence."""
    out = torch.full_like(idx, IGNORE)
    step = 1 if task.direction == "next" else -1
    for b in range(idx.shape[0]):
        row = idx[b].tolist()
        for t in range(len(row)):
            prev = [j for j in range(t) if row[j] == row[t]]
            if prev:
                out[b, t] = row[prev[-1] + step]
    return out


def candidates(task, t: int) -> int:
    """How many tokens position t may answer with (0: no answer is asked there)."""
    if task.name == "successor":
        return task.n_items - 1
    return t if t >= 2 else 0


def brute_successor(task, idx: torch.Tensor) -> torch.Tensor:
    """The token that follows each one in the cyclic order of ids, among the tokens it may see
    (all others; causal: those before it, from the third position on)."""
    out = torch.full_like(idx, IGNORE)
    for b in range(idx.shape[0]):
        row = idx[b].tolist()
        for t, x in enumerate(row):
            if not candidates(task, t):
                continue
            seen = [y for j, y in enumerate(row) if j != t and (task.name == "successor" or j < t)]
            larger = [y for y in seen if y > x]
            out[b, t] = min(larger) if larger else min(seen)
    return out


BRUTE = {"mqar": brute_mqar, "bind": brute_bind, "bind_codes": brute_bind_codes,
         "relation": brute_relation,
         "successor": brute_successor, "successor_causal": brute_successor}


@pytest.mark.parametrize("name", SYNTHETIC)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_targets_match_brute_force(name, seed):
    task = get_task(name, **SMALL[name])
    b = task.batch("train", 16, gen(seed))
    assert b["idx"].shape == b["targets"].shape == (16, task.seq_len)
    assert b["idx"].dtype == b["targets"].dtype == torch.long
    assert int(b["idx"].min()) >= 0 and int(b["idx"].max()) < task.d_vocab
    torch.testing.assert_close(b["targets"], BRUTE[name](task, b["idx"]), rtol=0, atol=0)


def test_mqar_chance_is_a_uniform_pick_among_the_context_values():
    """Every target is one of the row's n_pairs distinct context values, so a model without
    recall that picks among them scores 1 / n_pairs in expectation: the task's chance."""
    task = get_task("mqar", seq_len=32, vocab=64, n_pairs=4)
    assert task.chance == 1 / 4
    b = task.batch("val", 256, gen(5))
    vals = b["idx"][:, 1:2 * task.n_pairs:2]  # (B, n_pairs)
    assert all(len(set(r.tolist())) == task.n_pairs for r in vals)
    rows, cols = (b["targets"] != IGNORE).nonzero(as_tuple=True)
    hits = (vals[rows] == b["targets"][rows, cols][:, None]).sum(1)
    torch.testing.assert_close(hits, torch.ones_like(hits), rtol=0, atol=0)  # exactly one each
    # and the empirical score of that guesser sits at 1 / n_pairs
    pick = vals[rows, torch.randint(0, task.n_pairs, (len(rows),), generator=gen(6))]
    acc = (pick == b["targets"][rows, cols]).double().mean().item()
    assert abs(acc - task.chance) < 0.03, acc


def test_mqar_without_noise_matches_brute_force_and_zoology_layout():
    task = get_task("mqar", seq_len=24, vocab=16, n_pairs=3, random_non_queries=False)
    b = task.batch("val", 32, gen(3))
    torch.testing.assert_close(b["targets"], brute_mqar(task, b["idx"]), rtol=0, atol=0)
    half = task.vocab // 2
    keys, vals = b["idx"][:, 0:6:2], b["idx"][:, 1:6:2]
    assert bool(((keys >= 1) & (keys < half)).all()) and bool((vals >= half).all())
    # keys distinct within a row; the query region holds only zeros and the keys, once each
    assert all(len(set(r.tolist())) == 3 for r in keys)
    q = b["idx"][:, 6:]
    for r, k in zip(q, keys):
        nz = r[r != 0]
        assert sorted(nz.tolist()) == sorted(k.tolist())
    assert int((b["targets"] != IGNORE).sum(1).min()) == 3


def test_bind_distractors_share_the_group_and_differ_in_value():
    task = get_task("bind", **SMALL["bind"])
    b = task.batch("train", 64, gen(4))
    V, G = task.n_values, task.group_size
    for row in b["idx"]:
        items = [divmod(int(x), V) for x in row[:task.n_items]]
        keys = [k for k, _ in items]
        assert len(set(keys)) == len(keys)
        for qtok in row[task.n_items:]:
            k = int(qtok) - task.query_base
            v = dict(items)[k]
            near = [(kk, vv) for kk, vv in items if kk // G == k // G and kk != k]
            assert len(near) >= task.n_near
            # at least n_near same-group items carry a value different from the answer
            assert sum(vv != v for _, vv in near) >= task.n_near


def test_bind_key_recurs_with_different_values_across_sequences():
    task = get_task("bind", **SMALL["bind"])
    b = task.batch("train", 256, gen(5))
    values_of_key0 = {int(x) % task.n_values for x in b["idx"][:, :task.n_items].flatten()
                      if int(x) // task.n_values == 0}
    assert len(values_of_key0) == task.n_values  # key 0 seen with every value


@pytest.mark.parametrize("direction", ["next", "previous"])
def test_relation_directions(direction):
    task = get_task("relation", **SMALL["relation"], direction=direction)
    b = task.batch("test", 16, gen(6))
    torch.testing.assert_close(b["targets"], brute_relation(task, b["idx"]), rtol=0, atol=0)
    assert all(len(set(r[:task.n_context].tolist())) == task.n_context for r in b["idx"])


@pytest.mark.parametrize("name", ["successor", "successor_causal"])
def test_successor_chance_is_a_uniform_pick_among_the_candidates(name):
    task = get_task(name, **SMALL[name])
    b = task.batch("train", 4, gen(0))
    asked = [t for t in range(task.seq_len) if candidates(task, t)]
    assert [t for t in range(task.seq_len) if (b["targets"][:, t] != IGNORE).all()] == asked
    assert (b["targets"][:, [t for t in range(task.seq_len) if t not in asked]] == IGNORE).all()
    want = sum(1 / candidates(task, t) for t in asked) / len(asked)
    assert task.chance == pytest.approx(want, rel=1e-12)
    assert all(len(set(r.tolist())) == task.n_items for r in b["idx"])  # distinct tokens


@pytest.mark.parametrize("name", SYNTHETIC)
def test_same_seed_same_batches_other_seed_other_batches(name):
    task = get_task(name, **SMALL[name])
    g1, g2 = gen(7), gen(7)
    for _ in range(3):
        a, b = task.batch("train", 8, g1), task.batch("train", 8, g2)
        assert a.keys() == b.keys()
        for k in a:
            torch.testing.assert_close(a[k], b[k], rtol=0, atol=0)
    c = task.batch("train", 8, gen(8))
    assert not torch.equal(c["idx"], a["idx"])


def test_registry_and_errors():
    assert list(TASKS) == ["lm", "lm_char", "mlm", "translate", "mqar", "bind", "bind_codes",
                           "relation", "successor", "successor_causal"]
    with pytest.raises(ValueError, match=r"task: unknown task 'nope'.*allowed: \['bind'"):
        get_task("nope")
    with pytest.raises(ValueError, match=r"mqar\.n_pair: unknown key.*'n_pairs'"):
        get_task("mqar", n_pair=3)
    with pytest.raises(ValueError, match=r"bind\.seq_len: 30 must equal n_items \+ n_queries = 20"):
        get_task("bind", seq_len=30)
    with pytest.raises(ValueError, match=r"bind\.group_size: 5 must divide n_keys=32"):
        get_task("bind", group_size=5)
    with pytest.raises(ValueError, match=r"bind\.n_near: 4 must be an integer in \[0, 3\]"):
        get_task("bind", n_near=4)
    with pytest.raises(ValueError, match=r"relation\.direction: 'up' is not one of \['next', 'previous'\]"):
        get_task("relation", direction="up")
    with pytest.raises(ValueError, match=r"mqar\.seq_len: 20 leaves too few query slots"):
        get_task("mqar", seq_len=20, n_pairs=8)
    with pytest.raises(ValueError, match=r"relation: split 'dev' is not one of \['train', 'val', 'test'\]"):
        get_task("relation").batch("dev", 2, gen(0))
    with pytest.raises(ValueError, match=r"bind_codes\.n_items: 9 must be an integer in \[1, 8\]"):
        get_task("bind_codes", m=3, n_items=9)
    with pytest.raises(ValueError, match=r"bind_codes\.seq_len: 5 must equal n_items \+ n_queries"):
        get_task("bind_codes", m=2, seq_len=5)
    with pytest.raises(ValueError, match=r"successor\.seq_len: 9 must equal n_items = 8"):
        get_task("successor", seq_len=9)
    with pytest.raises(ValueError, match=r"successor_causal\.n_items: 40 must be an integer in \[3, 32\]"):
        get_task("successor_causal", n_items=40)


def test_config_is_what_a_run_id_hashes():
    assert get_task("bind").config() == {
        "task": "bind", "version": 1, "seq_len": 20, "n_keys": 32, "n_values": 16,
        "group_size": 4, "n_items": 16, "n_queries": 4, "n_near": 1}
    assert get_task("bind", seq_len=20) == get_task("bind")


def tiny_decoder(task, d_model=32, n_layers=1, seed=0):
    """A small model of the task's kind (a DecoderLM, or an Encoder for ``successor``)."""
    torch.manual_seed(seed)
    return KINDS[task.model_kind](ModelConfig(d_vocab=task.d_vocab, n_ctx=task.seq_len,
                                              d_model=d_model, n_layers=n_layers, n_heads=2))


@pytest.mark.parametrize("name", SYNTHETIC)
def test_loss_and_evaluate_on_a_real_model(name):
    task = get_task(name, **SMALL[name])
    model = tiny_decoder(task)
    loss = task.loss(model, task.batch("train", 4, gen(0)))
    assert loss.shape == () and torch.isfinite(loss)
    model.train()
    m1 = task.evaluate(model, gen(1), n_batches=2, batch_size=4)
    m2 = task.evaluate(model, gen(1), n_batches=2, batch_size=4)
    assert m1 == m2 and set(m1) == {"val_loss", "accuracy"}
    assert all(isinstance(v, float) for v in m1.values())
    assert model.training  # evaluate restores the mode it found
    # val_loss is the mean cross-entropy over exactly the target positions of the same batches
    g = gen(1)
    batches = [task.batch("val", 4, g) for _ in range(2)]
    model.eval()
    with torch.no_grad():
        per = [torch.nn.functional.cross_entropy(model(x["idx"]).flatten(0, 1), x["targets"].flatten(),
                                                 reduction="sum").item() for x in batches]
        first = task.loss(model, batches[0]).item()
    n = [int((x["targets"] != IGNORE).sum()) for x in batches]
    assert m1["val_loss"] == pytest.approx(sum(per) / sum(n), rel=1e-5)
    assert first == pytest.approx(per[0] / n[0], rel=1e-5)


@pytest.fixture
def one_thread():
    """Training a tiny model on a shared 2-core machine runs ~10x faster on one thread."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


LEARNABLE = {  # (options, learning rate, steps): small enough to learn in seconds on one core
    "relation": (SMALL["relation"], 1e-3, 800),
    # with 4 pairs this model sits >2.5k steps on the ln 4 plateau (guessing among the context's
    # values); with 2 pairs recall appears after ~1.2k steps
    "mqar": ({"seq_len": 16, "vocab": 16, "n_pairs": 2}, 1e-3, 2000),
    "bind": ({"n_keys": 8, "n_values": 4, "group_size": 2, "n_items": 6, "n_queries": 2, "n_near": 1},
             3e-3, 600),
    "bind_codes": ({"m": 2, "n_queries": 2}, 3e-3, 600),
    "successor": ({"vocab": 16, "n_items": 6}, 3e-3, 1000),
    "successor_causal": ({"vocab": 16, "n_items": 6}, 3e-3, 1000),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", SYNTHETIC)
def test_tiny_model_beats_chance(name, one_thread):
    opts, lr, steps = LEARNABLE[name]
    task = get_task(name, **opts)
    model = tiny_decoder(task, d_model=64, n_layers=2)
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    g = gen(0)
    for _ in range(steps):
        loss = task.loss(model, task.batch("train", 32, g))
        opt.zero_grad()
        loss.backward()
        opt.step()
    acc = task.evaluate(model, gen(123), n_batches=4, batch_size=64)["accuracy"]
    # well above chance: three quarters of the way from chance to 1 (3x chance, the old rule,
    # is out of reach since mqar's chance is 1/n_pairs = 0.5 here)
    assert acc > task.chance + 0.75 * (1 - task.chance), (name, acc, task.chance)


def test_bind_codes_inputs_are_the_key_and_value_bits():
    task = get_task("bind_codes", m=3)
    assert (task.n_items, task.seq_len, task.chance, task.d_vocab) == (8, 12, 1 / 8, 80)
    codes = task.input_codes()
    assert codes.shape == (task.d_vocab, 6)
    # reference: bit i of an id, 0 -> -1 and 1 -> +1, in float64
    bits = torch.tensor([[1.0 if (x >> i) & 1 else -1.0 for i in range(3)] for x in range(8)],
                        dtype=torch.float64)
    zero = torch.zeros(8, 3, dtype=torch.float64)
    want = torch.cat([torch.cat([bits[k], bits[v]])[None] for k in range(8) for v in range(8)]
                     + [torch.cat([bits, zero], 1), torch.cat([zero, bits], 1)])
    torch.testing.assert_close(codes.double(), want, rtol=0, atol=0)
    b = task.batch("val", 4, gen(0))  # every item code has the same norm: LayerNorm scales alike
    norms = codes[b["idx"][:, :task.n_items]].norm(dim=-1)
    torch.testing.assert_close(norms, torch.full_like(norms, 6 ** 0.5), rtol=0, atol=1e-6)


def test_a_run_freezes_the_embedding_to_the_task_codes(tmp_path):
    from qkvlab.train.build import apply_input_codes, build_seeded
    from qkvlab.train.trainer import FINAL_MODEL, run_from_spec

    task = get_task("bind_codes", m=2, n_queries=2)
    tied = build_seeded(ModelConfig(d_vocab=task.d_vocab, n_ctx=task.seq_len, d_model=16,
                                    n_layers=1, n_heads=1), "decoder", 0)
    with pytest.raises(ValueError, match=r"model\.tie_embeddings: task bind_codes fixes"):
        apply_input_codes(tied, task)
    narrow = build_seeded(ModelConfig(d_vocab=task.d_vocab, n_ctx=task.seq_len, d_model=2,
                                      n_layers=1, n_heads=1, tie_embeddings=False), "decoder", 0)
    with pytest.raises(ValueError, match=r"at most d_model=2 columns"):
        apply_input_codes(narrow, task)
    spec = {"task": "bind_codes", "task_options": {"m": 2, "n_queries": 2}, "kind": "decoder",
            "model": {"d_model": 16, "n_layers": 1, "n_heads": 1, "tie_embeddings": False},
            "train": {"steps": 5, "batch_size": 8, "eval_batches": 1, "eval_every": 0,
                      "log_every": 1, "seed": 0}}
    res = run_from_spec(spec, run_dir=tmp_path, progress=False)
    assert res.status == "done"
    from qkvlab.models.io import load_model

    wte = load_model(tmp_path / FINAL_MODEL).embed.wte.weight
    want = torch.zeros(task.d_vocab, 16)
    want[:, :4] = task.input_codes()
    torch.testing.assert_close(wte, want, rtol=0, atol=0)  # untouched by 5 optimizer steps
