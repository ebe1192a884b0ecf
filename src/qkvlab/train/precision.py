"""Which precision a run actually trains in: bf16 autocast only where the hardware helps it.

On a CPU without bf16 instructions (AVX2-only x86 such as many AMD EPYC, or AVX-512 without
``avx512_bf16``), PyTorch's bf16 autocast runs its matrix multiplies in slow fallback kernels,
an order of magnitude slower than fp32 with nothing said (measurements: DEVELOPERS.md). So
``precision="bf16"`` falls back to fp32 there with one warning per process; ``"bf16_force"``
insists on bf16 (warned once too). On CUDA, bf16 is used where
``torch.cuda.is_bf16_supported()``.

Whether a CPU has native bf16 is read from its flags (``/proc/cpuinfo``: ``avx512_bf16``,
``amx_bf16`` on x86, ``bf16`` on Arm): deterministic, so the same machine always trains the same
way. ``torch.backends.cpu.get_cpu_capability()`` (``"AVX2"``, ``"AVX512"``, ...) cannot tell:
``"AVX512"`` covers CPUs with and without bf16. Only where the flags cannot be read (not Linux)
does the decision fall to :func:`bf16_probe`, a measured time ratio.

Native bf16 is not always faster either: small GEMMs gain nothing and autocast adds casts, so
on some CPUs with ``avx512_bf16`` bf16 trains slower (DEVELOPERS.md has the ratios). So
there ``"bf16"`` still trains in bf16, as asked and as the flags say, but warns once with the
measured ratio whenever the probe finds bf16 at least ``NATIVE_SLOW_RATIO`` times slower.

    used = resolve_precision(cfg.precision, "cpu")   # "fp32" or "bf16"
    with autocast(used, "cpu"):
        loss = model(x)
"""

from __future__ import annotations

import contextlib
import functools
import warnings

import torch
import torch.nn.functional as F

from qkvlab.timing import interleaved, seconds
from qkvlab.train.config import PRECISIONS

__all__ = ["SlowPrecisionWarning", "autocast", "bf16_probe", "cpu_bf16_report", "cpu_capability",
           "cpu_flags", "native_cpu_bf16", "resolve_precision"]

NATIVE_BF16_FLAGS = ("avx512_bf16", "amx_bf16", "bf16")  # x86 AVX-512 BF16, x86 AMX, Arm BF16
SLOW_RATIO = 2.0  # without flags to read: bf16 counts as slow when the probe measures this
NATIVE_SLOW_RATIO = 1.2  # with native bf16: a warning (bf16 is kept) from this measured ratio


class SlowPrecisionWarning(UserWarning):
    """bf16 was asked for where it is slow (or unsupported); filter by this category."""


def cpu_capability() -> str:
    """The SIMD level PyTorch's CPU kernels dispatch to: ``"AVX2"``, ``"AVX512"``, ``"DEFAULT"``,
    ``"SVE256"``, ... (``torch.backends.cpu.get_cpu_capability()``)."""
    return torch.backends.cpu.get_cpu_capability()


@functools.lru_cache(maxsize=1)
def cpu_flags() -> frozenset[str] | None:
    """The CPU's feature flags (``flags`` on x86, ``Features`` on Arm, from /proc/cpuinfo), or
    None where they cannot be read (not Linux). Never raises."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() in ("flags", "Features"):
                    return frozenset(value.split())
    except OSError:
        pass
    return None


def native_cpu_bf16() -> bool | None:
    """True if the CPU has bf16 instructions (one of ``NATIVE_BF16_FLAGS``), False if it has
    none, None if its flags cannot be read."""
    flags = cpu_flags()
    return None if flags is None else bool(flags & set(NATIVE_BF16_FLAGS))


@functools.cache
def bf16_probe(n: int = 256, reps: int = 5) -> float:
    """Measured time(bf16 autocast step) / time(fp32 step) on this CPU; > 1 means bf16 is slower.

    The step is a transformer MLP block, forward and backward: ``gelu(x @ W1) @ W2`` on ``n``
    tokens of width ``n // 4`` with hidden width ``n``. The two precisions alternate (after
    one warm-up each) and the ratio is of the medians of ``reps`` timings, so a busy machine
    slows both alike. One thread: on a shared machine, small fp32 GEMMs split over threads wait
    for a busy core and jitter by orders of magnitude; the per-core ratio is what matters.
    Costs well under a second (about 0.1 s at n=256 on an AVX2-only CPU); cached per process
    and argument. It is a floor, not the training slowdown: the fallback bf16 GEMMs fall further
    behind as they grow (on an AVX2-only EPYC: about 5× here, 10× at n=512, 13× training the
    quick lm model). Touches neither torch's global RNG nor grad mode (it runs under no_grad too).

    Raises:
        ValueError: ``n < 4`` or ``reps < 1``.
    """
    if n < 4 or reps < 1:
        raise ValueError(f"bf16_probe: n={n!r} must be >= 4 and reps={reps!r} >= 1")
    g = torch.Generator().manual_seed(0)
    d = n // 4
    x = torch.randn(n, d, generator=g)
    w1 = (torch.randn(d, n, generator=g) * d ** -0.5).requires_grad_()
    w2 = (torch.randn(n, d, generator=g) * n ** -0.5).requires_grad_()

    def step(bf16: bool) -> None:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            y = F.gelu(x @ w1) @ w2  # (n, d)
        y.float().square().mean().backward()

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with torch.enable_grad():  # the warm-up call of each: kernel selection, allocations
            t = interleaved({"fp32": lambda: seconds(lambda: step(False)),
                             "bf16": lambda: seconds(lambda: step(True))}, reps)
    finally:
        torch.set_num_threads(threads)
    return t["bf16"] / max(t["fp32"], 1e-9)


def _cpu_words() -> str:
    """``capability AVX2, no avx512_bf16/amx_bf16`` for the messages."""
    native, flags = native_cpu_bf16(), cpu_flags() or frozenset()
    if native is None:
        words = "its bf16 flags could not be read"
    elif native:
        words = "native bf16"
    else:
        words = "no bf16 flag" if flags and "sse2" not in flags else "no avx512_bf16/amx_bf16"
    return f"capability {cpu_capability()}, {words}"


def _measured(ratio: float) -> str:
    """``measured 13.2× slower than fp32`` (or ``0.90× the time of fp32`` when not slower)."""
    if ratio >= 1.05:
        return f"measured {ratio:.1f}× slower than fp32"
    return f"measured {ratio:.2f}× the time of fp32"


@functools.cache
def _warn_once(message: str) -> None:
    # once per process and message, whatever the warnings filters say (workers train many runs)
    warnings.warn(message, SlowPrecisionWarning, stacklevel=3)  # resolve_precision's caller


def resolve_precision(requested: str, device: str) -> str:
    """The precision a run on ``device`` actually trains in: ``"fp32"`` or ``"bf16"``.

    - ``"fp32"``: fp32.
    - ``"bf16"``: on CUDA, bf16 where ``torch.cuda.is_bf16_supported()``, else fp32 with a
      warning. On a CPU with native bf16, bf16, with a warning (once per process) where
      :func:`bf16_probe` measures it ``NATIVE_SLOW_RATIO`` or more times slower than fp32 all
      the same. On a CPU without it, fp32 and a
      :class:`SlowPrecisionWarning` (once per process) that names the CPU capability and the
      slowdown :func:`bf16_probe` measured.
    - ``"bf16_force"``: bf16 on any CPU (warned once where it is slow); on CUDA as ``"bf16"``,
      since a device without bf16 support cannot be forced.

    ``device`` is a torch device string (``"cpu"``, ``"cuda"``, ``"cuda:1"``); anything not
    CUDA counts as the CPU, as for autocast.

    Raises:
        ValueError: ``requested`` is not one of ``PRECISIONS``.
    """
    if requested not in PRECISIONS:
        raise ValueError(f"precision: {requested!r} is not one of {list(PRECISIONS)}")
    if requested == "fp32":
        return "fp32"
    if str(device).startswith("cuda"):
        if torch.cuda.is_bf16_supported():
            return "bf16"
        _warn_once("this CUDA device does not support bf16; training in fp32 instead.")
        return "fp32"
    native = native_cpu_bf16()
    ratio = bf16_probe()
    if native:
        if ratio >= NATIVE_SLOW_RATIO:
            _warn_once(f"precision={requested!r}: training in bf16 autocast, which "
                       f"{_measured(ratio)} on this CPU ({_cpu_words()}) at the probe's size; "
                       f"small models train faster with precision='fp32' here.")
        return "bf16"
    if native is None and ratio < SLOW_RATIO:
        return "bf16"  # no flags to read, and bf16 did not measure slow
    if requested == "bf16_force":
        _warn_once(f"precision='bf16_force': training in bf16 autocast, which {_measured(ratio)} "
                   f"on this CPU ({_cpu_words()}).")
        return "bf16"
    _warn_once(f"bf16 autocast {_measured(ratio)} on this CPU ({_cpu_words()}); training in "
               f"fp32 instead. Set precision='bf16_force' to insist.")
    return "fp32"


def autocast(precision_used: str, device: str):
    """The context a forward pass runs in: bf16 autocast for ``"bf16"``, nothing for ``"fp32"``.

    ``precision_used`` is what :func:`resolve_precision` returned.

    Raises:
        ValueError: ``precision_used`` is neither ``"fp32"`` nor ``"bf16"``.
    """
    if precision_used == "fp32":
        return contextlib.nullcontext()
    if precision_used != "bf16":
        raise ValueError(f"precision_used: {precision_used!r} is not 'fp32' or 'bf16' "
                         "(resolve_precision gives one of them)")
    return torch.autocast("cuda" if str(device).startswith("cuda") else "cpu", dtype=torch.bfloat16)


def cpu_bf16_report(reps: int = 9) -> dict[str, object]:
    """What this CPU does with bf16, for benchmarks and logs: ``{cpu_capability, native_bf16,
    bf16_flags, bf16_fp32_ratio, probe}``. ``bf16_flags`` lists the native-bf16 flags found
    (empty if none; None if unreadable); ``bf16_fp32_ratio`` is :func:`bf16_probe` with ``reps``
    timings; ``probe`` says what it timed."""
    flags = cpu_flags()
    return {"cpu_capability": cpu_capability(), "native_bf16": native_cpu_bf16(),
            "bf16_flags": None if flags is None else sorted(flags & set(NATIVE_BF16_FLAGS)),
            "bf16_fp32_ratio": bf16_probe(256, reps),
            "probe": "time(bf16 autocast) / time(fp32): MLP block 64→256→64 on 256 tokens, "
                     f"forward+backward, 1 thread, median of {reps}, interleaved"}
