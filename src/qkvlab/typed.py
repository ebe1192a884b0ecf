"""Frozen dataclasses to and from plain dicts, with one error format for unknown keys.

Every configuration in qkvlab (attention, model, training, run spec, task options) is a frozen
dataclass validated in ``__post_init__``. Dicts come in from JSON (stored run specs,
``torchrun`` spec files, the command line); this module is the one door between the two:

    from_dict(TrainConfig, {"steps": 10}, "train")   # -> TrainConfig(steps=10, ...)
    from_dict(TrainConfig, {"stpes": 10}, "train")   # ValueError: train.stpes: unknown key;
                                                     # allowed: [...]

Nested dataclass fields (``RunSpec.train`` is a ``TrainConfig``) are built recursively, lists
become tuples where the field is a tuple, and ``to_dict`` is the inverse (tuples -> lists), so
``to_dict(from_dict(cls, d))`` is the canonical form that run ids are hashed from.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
import typing
from collections.abc import Iterable, Mapping
from typing import Any, TypeVar

T = TypeVar("T")


def unknown_key(where: str, key: str, allowed: Iterable[str]) -> ValueError:
    """The one error for a key a config does not have:
    ``where.key: unknown key; allowed: [...]``."""
    name = f"{where}.{key}" if where else str(key)
    return ValueError(f"{name}: unknown key; allowed: {sorted(allowed)}")


def check_keys(d: Mapping[str, Any], allowed: Iterable[str], where: str = "") -> None:
    """Raise ``unknown_key`` for the first (sorted) key of ``d`` not in ``allowed``."""
    allowed = set(allowed)
    bad = sorted(set(d) - allowed, key=str)
    if bad:
        raise unknown_key(where, bad[0], allowed)


def check_number(value: Any, name: str, lo: float = 0.0, hi: float = math.inf, *,
                 lo_open: bool = False, hi_open: bool = False) -> float:
    """``value`` as a float if it is a real number (not a bool), finite, in the interval from
    ``lo`` to ``hi`` (``[lo, hi]``; ``lo_open``/``hi_open`` leave an end out).

    Raises:
        ValueError: ``name: nan is not a finite number in [0, 1)`` (the interval as allowed).
    """
    ok = isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)
    if ok and (value > lo if lo_open else value >= lo) and (
            value < hi if hi_open else value <= hi):
        return float(value)
    if math.isinf(hi):
        where = f"{'>' if lo_open else '>='} {lo:g}"
    else:
        where = f"in {'(' if lo_open else '['}{lo:g}, {hi:g}{')' if hi_open else ']'}"
    raise ValueError(f"{name}: {value!r} is not a finite number {where}")


def check_step_list(values: Any, name: str) -> tuple[int, ...]:
    """``values`` (training steps) as a tuple of ints: each a whole number >= 0.

    Raises:
        ValueError: ``name: nan is not a step (a whole number >= 0)``.
    """
    if isinstance(values, (str, bytes)) or not isinstance(values, Iterable):
        raise ValueError(f"{name}: {values!r} must be a list of steps")
    out = []
    for v in values:
        ok = isinstance(v, numbers.Real) and not isinstance(v, bool) and math.isfinite(v)
        if not ok or v < 0 or v != int(v):
            raise ValueError(f"{name}: {v!r} is not a step (a whole number >= 0)")
        out.append(int(v))
    return tuple(out)


def field_names(cls: type) -> list[str]:
    return [f.name for f in dataclasses.fields(cls)]


def _dataclass_of(tp: Any) -> type | None:
    """The dataclass in a field type such as ``TrainConfig`` or ``ProbeConfig | None``."""
    if dataclasses.is_dataclass(tp):
        return tp
    for arg in typing.get_args(tp):
        if dataclasses.is_dataclass(arg):
            return arg
    return None


def _is_tuple(tp: Any) -> bool:
    return tp is tuple or typing.get_origin(tp) is tuple or any(
        typing.get_origin(a) is tuple for a in typing.get_args(tp))


def from_dict(cls: type[T], d: Mapping[str, Any] | T, where: str = "") -> T:
    """An instance of dataclass ``cls`` from ``d`` (an instance passes through unchanged).

    Raises:
        ValueError: ``d`` is not a mapping, has an unknown key, or a value its ``__post_init__``
            rejects; the message names the field as ``where.key``.
    """
    if isinstance(d, cls):
        return d
    if not isinstance(d, Mapping):
        raise ValueError(f"{where or cls.__name__}: {type(d).__name__} must be a mapping of "
                         f"{cls.__name__} options")
    check_keys(d, field_names(cls), where)
    hints = typing.get_type_hints(cls)
    kw = {}
    for k, v in d.items():
        sub, tp = _dataclass_of(hints[k]), hints[k]
        if sub is not None and v is not None:
            v = from_dict(sub, v, f"{where}.{k}" if where else k)
        elif _is_tuple(tp) and isinstance(v, list):
            v = tuple(v)
        kw[k] = v
    try:
        return cls(**kw)
    except TypeError as e:  # a required field missing
        raise ValueError(f"{where or cls.__name__}: {e}") from None


def to_dict(obj: Any) -> Any:
    """Plain JSON-able data of a dataclass instance (recursively; tuples become lists)."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: to_dict(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, Mapping):
        return {k: to_dict(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [to_dict(v) for v in obj]
    return obj


def replace(obj: T, where: str = "", **changes) -> T:
    """``dataclasses.replace`` that names an unknown field in the common format."""
    check_keys(changes, field_names(type(obj)), where)
    return dataclasses.replace(obj, **changes)
