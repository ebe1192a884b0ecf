"""Name -> attention class. Tests, benchmarks and the report iterate over ``DESIGNS``."""

from __future__ import annotations

DESIGNS: dict[str, type] = {}


def register(name: str):
    """Class decorator adding an attention design under ``name``."""

    def wrap(cls):
        if name in DESIGNS:
            raise ValueError(f"design {name!r} is already registered")
        DESIGNS[name] = cls
        cls.name = name
        return cls

    return wrap


def build_attention(cfg):
    """The attention module for an ``AttentionConfig``."""
    return DESIGNS[cfg.design](cfg)
