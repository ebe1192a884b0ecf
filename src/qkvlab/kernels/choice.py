"""A process-wide choice between a decoding kernel and PyTorch's own op: pinned for every model
by the user, else measured per model by the kernel module's probe, and active only inside a
``use`` block (``generate``'s token loop), so nothing outside decoding ever runs the kernel."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator


class KernelChoice:
    """``kinds[0]`` is ``"auto"`` (measure), the others the kernels; ``default`` is active
    outside every ``use`` block."""

    def __init__(self, what: str, kinds: tuple[str, ...], default: str):
        self.what, self.kinds = what, kinds
        self.pinned: str | None = None  # a kind pinned for every model; None: measure
        self.active = default

    def pin(self, kind: str) -> None:
        """Pin ``kind`` for every model (``"auto"``: measure again).

        Raises:
            ValueError: ``kind`` is not one of ``kinds``.
        """
        if kind not in self.kinds:
            raise ValueError(f"{self.what}: {kind!r} is not one of {list(self.kinds)}")
        self.pinned = None if kind == "auto" else kind

    @contextlib.contextmanager
    def use(self, kind: str) -> Iterator[None]:
        """Run ``kind`` inside the block (the previous kind again after it)."""
        if kind not in self.kinds[1:]:
            raise ValueError(f"{self.what}: {kind!r} is not one of {list(self.kinds[1:])}")
        before, self.active = self.active, kind
        try:
            yield
        finally:
            self.active = before
