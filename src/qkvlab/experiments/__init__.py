"""Experiments: named run lists, profiles, sweeps, the SQLite results store (statistics over
seeds are ``qkvlab.stats``).

The names below are imported on first use (PEP 562): a sweep's worker process imports
``qkvlab.experiments.worker`` and should not pay for the imports of the modules it does not use.
"""

import importlib

_WHERE = {"EXPERIMENTS": "registry", "PROFILES": "registry", "Profile": "registry",
          "describe": "registry", "experiment": "registry", "get_profile": "registry",
          "runs_of": "registry", "ResultsPending": "registry", "execute": "worker",
          "sweep": "runner", "DEFAULT_DB": "store", "Store": "store",
          "run_id": "store"}

__all__ = ["DEFAULT_DB", "EXPERIMENTS", "PROFILES", "Profile", "ResultsPending", "Store",
           "describe", "execute", "experiment", "get_profile",
           "run_id", "runs_of", "sweep"]


def __getattr__(name: str):
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{_WHERE[name]}"), name)
    globals()[name] = value  # the next lookup is a plain attribute
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
