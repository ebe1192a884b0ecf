"""Linear layers whose few-row products (decoding) run on the faster of two CPU kernels.

Decoding multiplies one row (batch 1) or a few rows by every weight matrix, once per token.
``F.linear`` sends such a product to the BLAS's single GEMM, which on some CPUs reads weights
that do not fit in cache far slower than memory allows; the same products written as one batched
GEMM over row blocks of each weight (``baddbmm`` of (n, out/n, in) blocks with the rows, MKL's
``SGEMM_BATCH``) read them at close to copy speed there. Where the weights fit in cache the
batched form is slower, and where the BLAS's GEMV is good it gains nothing (measurements in
DEVELOPERS.md, "Decode speed"). So each model's decoding measures both kernels once on its own
matrices and uses the faster:

    with use(decode_kernel(model, rows=B)):   # what generate() does around its token loop
        y = linear(x, weight, bias)   # the batched form for <= FEW_ROWS rows, no grad
    set_gemv_kernel("linear")         # pin a kernel for every model ("batched", or "auto")

Only products with grad mode off, on the CPU, in fp32, with at most ``FEW_ROWS`` rows, inside a
``use("batched")`` block take the batched form: training, evaluation and every forward outside
``generate`` run ``F.linear`` unchanged, so stored runs stay bit-identical. The two kernels sum
in different orders, so decoded logits agree with a full forward to float rounding, not bit for
bit. The ``use`` block is process-wide: generate() calls running at once in several Python
threads may run each other's choice (the same results, another speed).
"""

from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from qkvlab.kernels.choice import KernelChoice
from qkvlab.timing import interleaved, seconds

__all__ = ["FEW_ROWS", "GEMV_KERNELS", "Linear", "decode_kernel", "gemv_probe", "linear",
           "matrices", "set_gemv_kernel", "use"]

FEW_ROWS = 8  # products of at most this many rows count as matrix-vector work
GEMV_KERNELS = ("auto", "linear", "batched")
FASTER_RATIO = 1.2  # "auto" takes the batched form only where it measured this much faster
_BLOCKS = (4, 2)  # row blocks of the weight: the first count that divides its rows

CHOICE = KernelChoice("gemv kernel", GEMV_KERNELS, "linear")


def matrices(model: nn.Module) -> list[tuple[Tensor, Tensor | None]]:
    """(weight, bias) of every projection a decoding step of ``model`` multiplies a vector by:
    each attention's fused ``W_in`` and every ``nn.Linear`` (a tied unembedding once)."""
    mats = [(m.W_in, m.b_in) for m in model.modules() if hasattr(m, "W_in")]
    return mats + [(m.weight, m.bias) for m in model.modules() if isinstance(m, nn.Linear)]


def gemv_probe(mats: list[tuple[Tensor, Tensor | None]], reps: int = 5, rows: int = 1) -> float:
    """Measured time(``F.linear``) / time(batched form) of ``rows``-row products with ``mats``
    ((weight, bias) pairs, e.g. :func:`matrices`); > 1 means the batched form is faster.

    The kernels alternate after a warm-up and the ratio is of the medians of ``reps`` passes
    over all of ``mats`` at the current thread count, so a busy machine slows both alike and the
    weights sit where decoding finds them (in cache or not); cheap enough to run once per model.
    Leaves grad mode and the RNG alone.

    Raises:
        ValueError: ``reps < 1``, or no matrices.
    """
    if reps < 1 or not mats:
        raise ValueError(f"gemv_probe: reps={reps!r} must be >= 1 and mats non-empty "
                         f"(got {len(mats)})")
    xs = [torch.zeros(rows, w.shape[1], dtype=w.dtype, device=w.device) for w, _ in mats]

    def timer(fn):
        def products() -> None:
            for (w, b), x in zip(mats, xs):
                fn(x, w, b)
        return lambda: seconds(products, device=mats[0][0].device)

    with torch.no_grad():  # the warm-up call of each, then reps rounds, alternating
        t = interleaved({"linear": timer(F.linear), "batched": timer(_batched)}, reps)
    return t["linear"] / max(t["batched"], 1e-9)


def decode_kernel(model: nn.Module, part: nn.Module | None = None, rows: int = 1) -> str:
    """The kernel ``model``'s products of ``rows`` rows (a decode step of ``rows`` sequences)
    should use: ``"batched"`` or ``"linear"``.

    The pinned one (:func:`set_gemv_kernel`), else measured by :func:`gemv_probe` on the
    :func:`matrices` of ``part`` (the modules a decoding step runs; default the whole model)
    with that many rows, batched where ``FASTER_RATIO`` times faster or more (so where both
    are level ``F.linear`` stays), and kept on the model per thread count and row count. The
    row count matters: the batched form can win at one row and lose at four. (On the AVX-512
    AMD EPYC, 2026-11-28, a choice made at one row ran the bench's one-layer step 3-5x slower
    at four rows, 51 against 10-15 ms. The same slowdown on the AVX2 EPYC, 2026-12-06, was
    the strided output :func:`_batched` then returned, which sent SDPA to its unfused path, not
    the products; the AVX-512 one was not re-measured.)
    Models not in fp32 on the CPU, and steps of more than ``FEW_ROWS`` rows, never take the
    batched form, so they are not measured.
    """
    if CHOICE.pinned is not None:
        return CHOICE.pinned
    mats = matrices(model if part is None else part)
    w = mats[0][0] if mats else None
    if w is None or w.dtype != torch.float32 or w.device.type != "cpu" or rows > FEW_ROWS:
        return "linear"
    chosen = model.__dict__.setdefault("_gemv_kernel", {})
    key = (torch.get_num_threads(), rows)
    if key not in chosen:
        chosen[key] = "batched" if gemv_probe(mats, rows=rows) >= FASTER_RATIO else "linear"
    return chosen[key]


def set_gemv_kernel(kind: str) -> None:
    """Pin the few-row kernel of every model's decoding: ``"linear"`` (``F.linear`` always),
    ``"batched"``, or ``"auto"`` (the default: measured per model by :func:`decode_kernel`).

    Raises:
        ValueError: ``kind`` is not one of ``GEMV_KERNELS``.
    """
    CHOICE.pin(kind)


def use(kind: str) -> contextlib.AbstractContextManager[None]:
    """Few-row products inside the block run on ``kind`` (``"batched"`` or ``"linear"``)."""
    return CHOICE.use(kind)


def _batched(x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
    """``F.linear(x, weight, bias)`` as one batched GEMM over n row blocks of ``weight``: block i
    (out/n, in) times the rows as columns (in, R). The rows' layout (a stride-0 broadcast of xᵀ)
    is what MKL runs in its fast batched kernel. ``weight`` must be contiguous, its rows split
    into a count of ``_BLOCKS``; otherwise, ``F.linear``."""
    out, d_in = weight.shape
    n = next((k for k in _BLOCKS if out % k == 0), 0)
    if not n or not weight.is_contiguous():
        return F.linear(x, weight, bias)
    cols = x.reshape(-1, d_in).t().unsqueeze(0).expand(n, -1, -1)  # (n, in, R), no copy
    blocks = weight.view(n, out // n, d_in)
    y = (torch.bmm(blocks, cols) if bias is None
         else torch.baddbmm(bias.reshape(n, out // n, 1), blocks, cols))  # (n, out/n, R)
    # (R, out) with unit stride along out: a view for one row, a copy of R x out floats for
    # more. The view alone would leave every row's features R apart, and SDPA on the CPU runs
    # its unfused math path for a query whose last dimension is strided (3-5x slower decode
    # steps at batch 4 on the AVX2 EPYC, docs/bench-history.md)
    return y.permute(2, 0, 1).reshape(*x.shape[:-1], out).contiguous()


def linear(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """``F.linear(x, weight, bias)``: x (..., in) @ weightᵀ (+ bias) -> (..., out).

    Inside ``use("batched")``, with grad mode off, on the CPU, in fp32 and for at most
    ``FEW_ROWS`` rows, it runs as one batched GEMM over row blocks of ``weight`` (decoding's
    matrix-vector work); otherwise it is ``F.linear`` itself.
    """
    if (CHOICE.active != "batched" or torch.is_grad_enabled()
            or x.numel() > FEW_ROWS * x.shape[-1]
            or x.dtype != torch.float32 or x.device.type != "cpu"):
        return F.linear(x, weight, bias)
    return _batched(x, weight, bias)


class Linear(nn.Linear):
    """``nn.Linear`` (same parameters, ``state_dict`` and hooks) whose forward is :func:`linear`."""

    def forward(self, x: Tensor) -> Tensor:
        return linear(x, self.weight, self.bias)

