"""``qkvlab bench --only convert``: uptraining a converted decoder, qkvlab against a plain loop.

The peer is what a user writes with Hugging Face alone: the teacher's and the student's full
logits from ``model(x).logits`` (fp32, every position × the whole vocabulary at once), KL at
T = 2 plus next-token loss, backward, AdamW. qkvlab's step (``hf.uptrain``) computes the same
loss from the final hidden states in chunks of positions, the student's body in bf16 autocast
where the CPU has native bf16 (``train.precision``), the output layer and the loss in fp32.
Both train the same student (SmolLM2-135M tied K=V) from the same weights on the same batch,
interleaved round by round (``timing.interleaved_rounds``); the ratio is read by
``timing.ratio_stats``. The physical bound beside it: the step's matrix FLOPs (≈ 6 × the
student's and 2 × the teacher's parameters per token, the output layer included) over the
tokens/s, as a FLOP rate.

Both contenders run in one process, so both run under the allocator policy qkvlab's uptraining
sets (``train.memory.keep_freed_memory``: freed memory kept for the next step, not faulted in
anew); the plain loop's large logits gain from it too, so the ratio does not count it for
qkvlab.
"""

from __future__ import annotations

import copy
import dataclasses
import resource

import torch
from torch import nn

from qkvlab.timing import interleaved_rounds, rate, ratio_stats
from qkvlab.tables import markdown_table


def _plain_step(student, teacher, opt, x, alpha=0.5, temp=2.0):
    zs = student(input_ids=x).logits[:, :-1].flatten(0, 1)
    with torch.no_grad():
        zt = teacher(input_ids=x).logits[:, :-1].flatten(0, 1)
    kl = nn.functional.kl_div(nn.functional.log_softmax(zs / temp, -1),
                              nn.functional.log_softmax(zt / temp, -1), log_target=True,
                              reduction="batchmean")
    loss = alpha * temp * temp * kl + (1 - alpha) * nn.functional.cross_entropy(
        zs, x[:, 1:].flatten())
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()


def bench_convert(source: str = "smollm2", rounds: int = 3, batch: int = 4, seq_len: int = 256,
                  log=print) -> dict:
    """Tokens/s of one uptraining step, qkvlab vs the plain loop; records and the ratio."""
    from qkvlab.hf.cost import load_lm
    from qkvlab.hf.tie import tie
    from qkvlab.hf.uptrain import UptrainConfig, distill_loss
    from qkvlab.train.memory import keep_freed_memory
    from qkvlab.train.precision import autocast, resolve_precision

    kept = keep_freed_memory()  # as Uptrainer does on the CPU; for both contenders (see module)
    teacher, _ = load_lm(source)
    for p in teacher.parameters():
        p.requires_grad_(False)
    base = tie(copy.deepcopy(teacher), "kv", start="avg")  # the start does not change the speed
    students = {k: copy.deepcopy(base) for k in ("qkvlab", "qkvlab_bf16_head", "plain")}
    for s in students.values():  # copies of the frozen teacher: every parameter trains again
        s.train().requires_grad_(True)
    opts = {k: torch.optim.AdamW(s.parameters(), lr=1e-5) for k, s in students.items()}
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, teacher.config.vocab_size, (batch, seq_len), generator=g)
    cfg = UptrainConfig(batch=batch, seq_len=seq_len)
    precision = resolve_precision(cfg.precision, "cpu")

    def ours(name="qkvlab", cfg=cfg):
        loss = distill_loss(students[name], teacher, x, cfg, lambda: autocast(precision, "cpu"))
        opts[name].zero_grad(set_to_none=True)
        loss.backward()
        opts[name].step()

    tokens = batch * seq_len
    log(f"convert bench: {source}, batch {batch} × {seq_len}, {rounds} interleaved rounds, "
        f"qkvlab in {precision}")
    bf16_head = dataclasses.replace(cfg, head="bf16")
    got = interleaved_rounds({"qkvlab": rate(ours, tokens),
                              "qkvlab_bf16_head": rate(lambda: ours("qkvlab_bf16_head", bf16_head),
                                                       tokens),
                              "plain": rate(lambda: _plain_step(students["plain"], teacher,
                                                                opts["plain"], x), tokens)},
                             rounds)
    n_student = sum(p.numel() for p in {id(p): p for p in base.parameters()}.values())
    n_teacher = sum(p.numel() for p in teacher.parameters())
    flops_per_token = 6 * n_student + 2 * n_teacher
    rows = [{"contender": k, "tokens_per_s": sorted(v)[len(v) // 2], "rounds": v,
             "precision": {"qkvlab": precision, "plain": "fp32"}.get(
                 k, f"{precision}, output layer bf16"),
             "tflop_s": flops_per_token * sorted(v)[len(v) // 2] / 1e12} for k, v in got.items()]
    return {"model": source, "batch": batch, "seq_len": seq_len, "rows": rows,
            "ratio": ratio_stats(got["qkvlab"], got["plain"]),
            "ratio_bf16_head": ratio_stats(got["qkvlab_bf16_head"], got["plain"]),
            "flops_per_token": flops_per_token, "keep_freed_memory": kept,
            "peak_rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2 ** 20}


def convert_table(res: dict) -> str:
    """The bench's rows as a markdown table, the ratio and its verdict under it."""
    r = res["ratio"]
    lines = [markdown_table(["contender", "precision", "tokens/s (median)", "matrix TFLOP/s"],
                            [[x["contender"], x["precision"], f"{x['tokens_per_s']:.1f}",
                              f"{x['tflop_s']:.3f}"] for x in res["rows"]], cell=str)]
    lines.append(f"\nqkvlab / plain loop: {r['ratio']:.2f}× (min {r['min']:.2f}, max "
                 f"{r['max']:.2f}; {r['verdict']}); process peak RSS {res['peak_rss_gb']:.1f} GiB")
    if "ratio_bf16_head" in res:
        b = res["ratio_bf16_head"]
        lines.append(f"qkvlab with --head bf16 / plain loop: {b['ratio']:.2f}× (min "
                     f"{b['min']:.2f}, max {b['max']:.2f}; {b['verdict']})")
    return "\n".join(lines)
