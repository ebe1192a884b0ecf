"""The C allocator's policy for CPU training steps that allocate and free large tensors.

glibc's ``malloc`` serves every request above its mmap threshold (at most 32 MiB) with a fresh
``mmap`` and gives it back on ``free``, so each such tensor's pages are faulted in and zeroed
by the kernel anew, every step. Uptraining SmolLM2 allocates the output layer's logits in
chunks of 256 positions × 49,152 words (50 MB in fp32) several times per chunk: on a 2-core
AMD EPYC (2026-11-28) one step of batch 4 × 256 took 1.45 million page faults and 3-4 s of
its 9-11 s in the kernel. :func:`keep_freed_memory` turns ``mmap`` off for the process's
allocations and raises the trim threshold, so freed blocks stay in the heap and the next step
reuses them: 0-25 thousand faults and under 0.5 s of system time per step, the same step
1.2-1.3x faster (DEVELOPERS.md, "Converting a trained model"). The tensors' contents, and so
every result, are the same: only where their memory comes from changes (PyTorch aligns each
CPU tensor to 64 bytes either way).

It is process-wide and one-way (memory a step freed is kept for the next, not returned to the
system; the peak RSS is unchanged), so it is applied where long CPU uptraining runs
(``hf.uptrain.Uptrainer``, the convert bench), never at import.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools

__all__ = ["keep_freed_memory"]

_M_TRIM_THRESHOLD, _M_MMAP_MAX = -1, -4  # glibc's malloc.h
TRIM_BYTES = 2**31 - 1  # mallopt's value is a C int: free heap top kept up to ~2 GiB


@functools.cache
def keep_freed_memory() -> bool:
    """Where the C library is glibc: serve large allocations from the heap and keep freed
    memory for reuse (see module). True where applied, False elsewhere (musl, macOS, Windows:
    nothing changes there). Applied once per process."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or None)
        if not hasattr(libc, "gnu_get_libc_version") or not hasattr(libc, "mallopt"):
            return False
        return bool(libc.mallopt(_M_MMAP_MAX, 0)) and bool(libc.mallopt(_M_TRIM_THRESHOLD,
                                                                          TRIM_BYTES))
    except OSError:  # no C library to load by name
        return False
