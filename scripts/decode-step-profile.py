"""Where one batch decode step spends its time, at one thread and at two: `python
scripts/decode-step-profile.py [--context 32768] [--batch 4] [--design standard]`.

The bench's kv model (`models.speed.kv_decode_speed`: one layer, d_model 512, 8 heads of 64),
its cache filled with random values to ``context`` tokens, one step as ``generate`` runs it
(``DecoderLM.decoding``: the kernels its probes choose). Prints each thread count's median step
over 15 calls (twice, alternating), then PyTorch's profiler table of five steps per thread
count, the ops by their own time and input shapes. The Numba decode kernel is not a PyTorch op,
so where it runs the attention is missing from the table (it is the step's time the table
lacks). Written to find the AVX2 EPYC's batch-4 slowdown at two threads (2026-12-06,
docs/bench-history.md).
"""

import argparse
import statistics
import time

import torch
from torch.profiler import ProfilerActivity, profile

from qkvlab.models import ModelConfig
from qkvlab.models.lm import DecoderLM
from qkvlab.models.speed import kv_variants

p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
p.add_argument("--context", type=int, default=32768)
p.add_argument("--batch", type=int, default=4)
p.add_argument("--design", default="standard", help="a layout of models.speed.kv_variants")
args = p.parse_args()
T, B = args.context, args.batch
variants = kv_variants(8, rotary=True)
if args.design not in variants:
    raise SystemExit(f"--design {args.design!r}: one of {', '.join(variants)}")
torch.manual_seed(0)
cfg = ModelConfig(d_vocab=65, n_ctx=T + 1, d_model=512, n_layers=1, n_heads=8,
                  **variants[args.design])
model = DecoderLM(cfg).eval()
caches = model.new_caches(B, T + 1)
for c in caches:
    c.k.uniform_(-1, 1)
    if not c.shared:
        c.v.uniform_(-1, 1)
step = torch.zeros(B, 1, dtype=torch.long)


def run() -> None:
    for c in caches:
        c.length = T
    with torch.no_grad(), model.decoding(B, T + 1):
        model(step, caches=caches)


for threads in (1, 2, 1, 2):
    torch.set_num_threads(threads)
    for _ in range(3):
        run()
    times = []
    for _ in range(15):
        t = time.perf_counter()
        run()
        times.append(time.perf_counter() - t)
    print(f"{threads} thread(s): median step {statistics.median(times) * 1e3:.1f} ms "
          f"(min {min(times) * 1e3:.1f}), {args.design} at {T:,} x {B}", flush=True)
for threads in (1, 2):
    torch.set_num_threads(threads)
    run()
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        for _ in range(5):
            run()
    print(f"\n{threads} thread(s), five steps:")
    print(prof.key_averages(group_by_input_shape=True).table(
        sort_by="self_cpu_time_total", row_limit=12, max_name_column_width=48,
        max_shapes_column_width=64))
