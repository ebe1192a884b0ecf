"""Checkpoints: exact round trip of model + AdamW + RNG; corrupt, truncated, foreign files fail
with a clear ValueError; nothing is unpickled."""

from __future__ import annotations

import json

import pytest
import safetensors.torch
import torch

from qkvlab.models import ModelConfig, build_model
from qkvlab.train import TrainConfig, load_checkpoint, make_optimizer, read_checkpoint, save_checkpoint


def _trained(design="tied_qk", seed=0):
    torch.manual_seed(seed)
    model = build_model(ModelConfig(d_vocab=13, n_ctx=8, d_model=16, n_layers=1, n_heads=2,
                                    design=design), "decoder")
    opt = make_optimizer(model, TrainConfig())
    idx = torch.randint(0, 13, (3, 8))
    for _ in range(2):
        loss = torch.nn.functional.cross_entropy(model(idx).flatten(0, 1), idx.flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()
    return model, opt


@pytest.fixture
def ckpt(tmp_path):
    model, opt = _trained()
    gen = torch.Generator().manual_seed(7)
    path = save_checkpoint(tmp_path / "c.safetensors", model, opt, step=2,
                           rng={"data": gen.get_state()}, state={"history": [{"step": 1, "x": 0.5}]})
    return path, model, opt


def test_round_trip_restores_weights_optimizer_and_rng_exactly(ckpt):
    path, model, opt = ckpt
    fresh, fopt = _trained(seed=1)  # different weights and moments
    out = load_checkpoint(path, fresh, fopt)
    assert out["step"] == 2 and out["state"] == {"history": [{"step": 1, "x": 0.5}]}
    for (n, a), (_, b) in zip(model.state_dict().items(), fresh.state_dict().items()):
        torch.testing.assert_close(b, a, rtol=0, atol=0, msg=n)
    for p, q in zip(model.parameters(), fresh.parameters()):
        for k in ("exp_avg", "exp_avg_sq", "step"):
            torch.testing.assert_close(fopt.state[q][k], opt.state[p][k], rtol=0, atol=0)
    torch.testing.assert_close(out["rng"]["data"], torch.Generator().manual_seed(7).get_state())
    # tied Q=K: stored once, still one parameter after loading
    names = safetensors.torch.load_file(str(path))
    assert sum(k.startswith("model.") for k in names) == len(list(model.parameters()))


def test_truncated_checkpoint_is_a_clear_error(ckpt):
    path = ckpt[0]
    data = path.read_bytes()
    for cut in (10, len(data) // 2, len(data) - 3):
        path.write_bytes(data[:cut])
        with pytest.raises(ValueError, match="truncated or not a safetensors"):
            read_checkpoint(path)


def test_bit_flip_in_tensor_data_is_detected(ckpt):
    path = ckpt[0]
    data = bytearray(path.read_bytes())
    data[-5] ^= 0xFF  # inside the last tensor's bytes, header intact
    path.write_bytes(bytes(data))
    with pytest.raises(ValueError, match="corrupt"):
        read_checkpoint(path)


def test_foreign_and_missing_files_are_clear_errors(tmp_path):
    plain = tmp_path / "plain.safetensors"
    safetensors.torch.save_file({"w": torch.zeros(2)}, str(plain))
    with pytest.raises(ValueError, match="not a qkvlab training checkpoint"):
        read_checkpoint(plain)
    with pytest.raises(ValueError, match="does not exist"):
        read_checkpoint(tmp_path / "nope.safetensors")
    pickle_file = tmp_path / "evil.safetensors"
    torch.save({"w": torch.zeros(2)}, pickle_file)  # a pickle in disguise is refused, not loaded
    with pytest.raises(ValueError, match="truncated or not a safetensors"):
        read_checkpoint(pickle_file)


def test_checkpoint_of_another_model_is_refused(ckpt):
    path = ckpt[0]
    other, oopt = _trained(design="standard")
    with pytest.raises(ValueError, match="does not match the model"):
        load_checkpoint(path, other, oopt)


def test_malformed_metadata_is_a_clear_error(ckpt, tmp_path):
    path = ckpt[0]
    tensors = safetensors.torch.load_file(str(path))
    from qkvlab.train.checkpoints import _digest

    bad = tmp_path / "bad.safetensors"
    safetensors.torch.save_file(tensors, str(bad), metadata={"qkvlab_checkpoint": "{not json",
                                                             "qkvlab_digest": _digest(tensors)})
    with pytest.raises(ValueError, match="malformed metadata"):
        read_checkpoint(bad)
    safetensors.torch.save_file(tensors, str(bad), metadata={
        "qkvlab_checkpoint": json.dumps({"format": 99}), "qkvlab_digest": _digest(tensors)})
    with pytest.raises(ValueError, match="format 99"):
        read_checkpoint(bad)


def test_no_temp_files_left_after_save(ckpt):
    path = ckpt[0]
    assert sorted(p.name for p in path.parent.iterdir()) == ["c.safetensors"]
