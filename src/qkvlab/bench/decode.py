"""Batch-1 greedy decoding: qkvlab's KV cache against HF ``generate()`` on the same weights,
beside two floors (the memory-bandwidth bound and the step's matrix-vector products alone,
with ``F.linear`` and with the kernel qkvlab's decoding chose)."""

from __future__ import annotations

import statistics
from collections.abc import Callable

import torch
import torch.nn.functional as F

from qkvlab.bench.peers import hf_gpt2
from qkvlab.bench.workload import SIZES, VOCAB
from qkvlab.kernels import gemv, linear
from qkvlab.models import DecoderLM, from_hf_gpt2
from qkvlab.models.speed import copy_bandwidth, weight_bytes_per_token
from qkvlab.timing import interleaved_rounds, rate, ratio_stats, seconds


@torch.no_grad()
def gemv_seconds_per_token(model: DecoderLM, reps: int = 9, fn: Callable = F.linear) -> float:
    """Seconds the matrix-vector products of one batch-1 decoding step take on their own: every
    projection (each attention's fused W_in, every ``nn.Linear``, the unembedding once) applied
    to one vector with its bias by ``fn`` (``F.linear``, the kernel HF runs; or qkvlab's
    :func:`qkvlab.kernels.linear`, the one its decoding runs), median of ``reps``. Where the
    weights fit in the CPU's cache this, not the copy bandwidth, is the floor the rest of the
    step adds to."""
    mats = gemv.matrices(model)
    xs = [torch.randn(1, w.shape[1], dtype=w.dtype, device=w.device) for w, _ in mats]

    def once() -> None:
        for (w, b), x in zip(mats, xs):
            fn(x, w, b)

    device = mats[0][0].device
    with gemv.use(gemv.decode_kernel(model)):  # what linear runs inside generate
        seconds(once, device=device)  # warm-up
        return statistics.median(seconds(once, device=device) for _ in range(reps))


def bench_decode(size: str = "large", new_tokens: int = 128, rounds: int = 3,
                 device: str = "cpu", log=print) -> dict[str, float]:
    """Batch-1 greedy decode tokens/s on ``device``: qkvlab's KV cache vs HF ``generate()``
    (same weights),
    the ratio (median, min, max over rounds), and two bounds: measured copy bandwidth / weight
    bytes read per token, and the step's matrix-vector products alone
    (:func:`gemv_seconds_per_token`), the tighter one where the weights fit in cache: with
    ``F.linear`` (HF's kernel) and with the kernel qkvlab's decoding chose for the model
    (``gemv_kernel``: batched or linear; ``gemv_probe``: the ratio measured again)."""
    import transformers  # lazy: optional extra [bench]

    s = SIZES[size]
    _, hf = hf_gpt2(s, VOCAB)
    hf.eval()
    ours = from_hf_gpt2(hf).eval().to(device)
    hf.to(device)
    prompt = torch.randint(0, VOCAB, (1, 8), generator=torch.Generator().manual_seed(0))
    prompt = prompt.to(device)
    new = min(new_tokens, s.n_ctx - prompt.shape[1])
    transformers.logging.set_verbosity_error()

    def hf_generate() -> None:
        with torch.no_grad():
            hf.generate(prompt, max_new_tokens=new, min_new_tokens=new, do_sample=False,
                        pad_token_id=0)

    # Same weights, same function: compare logits on a generated sequence (argmax ties of an
    # untrained model can flip on float rounding, so token equality is tested in float64 in
    # the test suite instead).
    seq = ours.generate(prompt, new, greedy=True)
    with torch.no_grad():
        gap = (ours(seq) - hf(seq).logits).abs().max().item()
    log(f"decode, size {size}, batch 1, {device}, {new} new tokens "
        f"(max |logit diff| vs HF: {gap:.2g})")
    raw = interleaved_rounds({"qkvlab": rate(lambda: ours.generate(prompt, new, greedy=True),
                                             work=new, device=device),
                              "hf_generate": rate(hf_generate, work=new, device=device)}, rounds)
    rates = {k: statistics.median(v) for k, v in raw.items()}
    rates.update(ratio_stats(raw["qkvlab"], raw["hf_generate"]), max_logit_diff=gap,
                 threads=torch.get_num_threads())
    bw = copy_bandwidth(device=device)
    rates.update(bandwidth_gb_s=bw / 1e9, weight_mb_per_token=weight_bytes_per_token(ours) / 1e6,
                 bound_tokens_per_s=bw / weight_bytes_per_token(ours),
                 gemv_tokens_per_s=1 / gemv_seconds_per_token(ours),
                 gemv_ours_tokens_per_s=1 / gemv_seconds_per_token(ours, fn=linear),
                 gemv_kernel=gemv.decode_kernel(ours),
                 gemv_probe=gemv.gemv_probe(gemv.matrices(ours)))
    return rates
