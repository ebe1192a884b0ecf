"""Damaged inputs for every format qkvlab parses, and the process that feeds them to qkvlab.

``seeds(folder)`` writes one small valid input per format: a qkvlab checkpoint, a training
checkpoint, HF folders (BERT, GPT-2, Llama, Whisper), GGUF (float and Q8_0), CTranslate2,
Marian, ONNX, a run spec and tokenizer JSON (char and BPE). ``cases(folder, seeds, slow)``
damages copies of them: truncations, bit flips, and header fields set to 0, negative, huge and
wrong-typed values (:mod:`fuzz_fields` knows each format's fields). Each case is
``{"id", "reader", "path", "target"}``: ``reader`` names the qkvlab function that reads
``path``, ``target`` the file that was damaged.

Run as a script (``python fuzz_inputs.py cases.json``) it reads every case in turn under a
memory cap (``RLIMIT_AS``, set once the imports are done) and prints one JSON line per case:
``{"id", "outcome", "error", "seconds", "peak_mb"}``, where outcome is ``load`` (read without
error), ``clean`` (an ``InputFileError`` whose message names the file), ``unnamed`` (one that
does not), ``crash`` (any other exception), ``over_cap`` (``MemoryError``, or a peak resident
size above the case's allowance), ``unpickled`` (a pickle was opened: never allowed),
``measured`` (a model analysed to a NaN or an infinity: a damaged model got a number) or
``executed`` (planted code ran: :mod:`fuzz_hostile`). The ``analyze`` reader runs the whole
analysis (nulls and all, the CKA aside); the ``store`` reader reads a results store and then
opens it for writing as a sweep does. The
test (``test_fuzz_inputs.py``) runs it, restarts it past a case that hangs or kills it, and
counts. Nothing here uses pickle.
"""

from __future__ import annotations

import json
import math
import os
import random
import resource
import shutil
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import fuzz_fields  # noqa: E402  (this folder, put on the path above)
import fuzz_hostile  # noqa: E402

HUGE_INTS = [0, -1, 2**31 - 1, 2**32 + 7, 2**63 - 1, 10**12]
WRONG_TYPES = ["x", 1.5, None, [], {}, True, [1, 2], 1e308]
CAP_BYTES = 1536 << 20  # address space a case may add on top of the imports
PEAK_ALLOWANCE = 256 << 20  # resident growth a case may show beyond 32 x the input's size


def seeds(folder: Path) -> dict[str, tuple[str, Path, Path]]:
    """``{name: (reader, path, target)}``: one small valid input per format."""
    folder.mkdir(parents=True, exist_ok=True)
    return fuzz_fields.write_seeds(folder)


def _copy(src: Path, dst: Path) -> Path:
    if src.is_dir():
        shutil.copytree(src, dst)
    else:
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src, dst)
    return dst


def cases(folder: Path, seed_map: dict, slow: bool = False, rng_seed: int = 0) -> list[dict]:
    """Every damaged copy of every seed (written under ``folder``), plus the seeds themselves."""
    rng = random.Random(rng_seed)
    out: list[dict] = []
    marker = seed_map["spec"][1].parent / fuzz_hostile.MARKER
    n_flips, n_cuts = (1000, 200) if slow else (10, 8)
    for name, (reader, path, target) in seed_map.items():
        rel = target.relative_to(path) if path.is_dir() else None

        def case(tag: str, data: bytes | None = None, root=path, rel=rel, name=name,
                 reader=reader):
            safe = "".join(ch if ch.isalnum() or ch in "._=:-" else "_" for ch in tag)[:80]
            dst = folder / f"{name}-{len(out):05d}-{safe}"
            dst = dst if root.is_dir() else dst.with_suffix(root.suffix)
            _copy(root, dst)
            tgt = dst / rel if rel is not None else dst
            if data is not None:
                tgt.write_bytes(data)
            out.append({"id": f"{name}/{tag}", "reader": reader, "path": str(dst),
                        "target": str(tgt), "marker": str(marker)})

        raw = target.read_bytes()
        n = len(raw)
        case("intact")
        cuts = {0, 1, 4, 8, 9, 16, 24, 32, n // 4, n // 2, n - 1}
        cuts |= {rng.randrange(n) for _ in range(n_cuts - len(cuts))} if n_cuts > len(cuts) else set()
        for k in sorted(c for c in cuts if 0 <= c < n):
            case(f"cut{k}", raw[:k])
        for j in range(n_flips):
            # half the flips in the header region, where a bit changes a size or an offset
            pos = rng.randrange(min(n, 1024)) if j % 2 == 0 else rng.randrange(n)
            data = bytearray(raw)
            data[pos] ^= 1 << rng.randrange(8)
            case(f"flip{pos}", bytes(data))
        for tag, data in fuzz_fields.field_mutations(name, raw, HUGE_INTS, WRONG_TYPES):
            case(tag, data)
    return out


# ---- the reading process ---------------------------------------------------------------------
def _readers():
    import torch

    from qkvlab.analysis.run import analyze
    from qkvlab.data.tokenizers import load_tokenizer
    from qkvlab.models import load_model
    from qkvlab.train.checkpoints import load_checkpoint
    from qkvlab.train.config import load_spec

    def checkpoint(path):
        model, opt = fuzz_fields.ckpt_model()
        return load_checkpoint(path, model, opt)

    def allocate(path):  # the harness's own check: this must come back over the cap
        import numpy as np

        return np.ones(int(Path(path).read_text()), np.uint8)

    import gguf  # noqa: F401  (imported before the cap: the readers import them lazily)
    import onnx  # noqa: F401
    import transformers.integrations.gguf  # noqa: F401  (load_lm's: the GGUF reader, Llama)
    import transformers.modeling_gguf_pytorch_utils  # noqa: F401
    import transformers.models.llama.modeling_llama  # noqa: F401
    from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: F401
    import tokenizers  # noqa: F401
    torch.set_num_threads(1)
    def measure(path):  # all of `qkvlab analyze` but the CKA (which needs a tokenizer)
        return analyze(path, n_null=4, cka=False, figures=False, progress=False)

    from qkvlab.hf.cost import load_lm  # tiecost's and convert's loader, through transformers

    def lm(path):
        return load_lm(str(path))

    return {"analyze": measure, "load_model": load_model, "store": fuzz_hostile.read_store,
            "lm": lm, "checkpoint": checkpoint,
            "spec": load_spec, "tokenizer": load_tokenizer, "allocate": allocate}


def self_checks(folder: Path) -> list[dict]:
    """Two cases that must come back ``over_cap``: 4 GiB (past the address-space cap) and
    400 MiB touched (under it, but far past a 10-byte input's allowance)."""
    out = []
    for n in (4 << 30, 400 << 20):
        f = folder / f"allocate-{n}"
        f.write_text(str(n))
        out.append({"id": f"self-check/allocate {n >> 20} MiB", "reader": "allocate",
                    "path": str(f), "target": str(f)})
    return out


class Unpickled(BaseException):
    """Raised by the patched unpicklers: no input here may reach one."""


def _forbid_pickle() -> None:
    import pickle

    import torch

    def refuse(*a, **k):
        raise Unpickled("a pickle was opened")

    pickle.load = pickle.loads = refuse
    torch.load = refuse


def _vm_kb(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def _reset_peak() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # resets VmHWM, the peak resident size, to the current one
        return True
    except OSError:
        return False


def _size(path: Path) -> int:
    if path.is_dir():
        return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
    return path.stat().st_size if path.exists() else 0


def run_cases(items: list[dict], start: int = 0) -> None:
    """Read ``items[start:]``, one JSON line per case on stdout (see the module docstring)."""
    from qkvlab.inputs import InputFileError

    readers = _readers()
    _forbid_pickle()
    if items:  # the planted module is importable, so importing it would show
        sys.path.insert(0, str(Path(items[0]["marker"]).parent))
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    cap = _vm_kb("VmSize") * 1024 + CAP_BYTES
    resource.setrlimit(resource.RLIMIT_AS, (cap if hard == resource.RLIM_INFINITY
                                            else min(cap, hard), hard))
    print(json.dumps({"ready": True, "cap_mb": cap >> 20}), flush=True)
    for i in range(start, len(items)):
        c = items[i]
        print(json.dumps({"start": i}), flush=True)
        peak_known = _reset_peak()
        base, t0 = _vm_kb("VmRSS"), time.perf_counter()
        error, outcome = "", "load"
        try:
            got = readers[c["reader"]](c["path"])
            if c["reader"] == "analyze" and _nonfinite(got):
                outcome, error = "measured", f"a non-finite measure: {_nonfinite(got)}"
        except InputFileError as e:
            error = str(e)
            outcome = "clean" if _names(error, c["path"]) else "unnamed"
        except MemoryError as e:
            outcome, error = "over_cap", f"MemoryError: {e}"
        except Unpickled as e:
            outcome, error = "unpickled", str(e)
        except Exception as e:  # noqa: BLE001 (anything else is what the fuzz looks for)
            outcome, error = "crash", f"{type(e).__name__}: {e}"
        ran = [m for m in fuzz_hostile.PLANTED if m in sys.modules]
        marker = Path(c.get("marker", os.devnull + ".none"))
        if ran or marker.exists():
            outcome, error = "executed", f"planted code ran ({ran}); {error}"
            marker.unlink(missing_ok=True)
            for m in ran:
                del sys.modules[m]
        peak = (_vm_kb("VmHWM") - base) * 1024 if peak_known else 0
        if peak > 32 * _size(Path(c["path"])) + PEAK_ALLOWANCE and outcome != "crash":
            outcome, error = "over_cap", f"peak resident growth {peak >> 20} MiB; {error}"
        print(json.dumps({"id": c["id"], "i": i, "outcome": outcome, "error": error[:500],
                          "seconds": round(time.perf_counter() - t0, 3),
                          "peak_mb": round(peak / 2**20, 1)}), flush=True)


def _nonfinite(result: dict) -> str:
    """Where the first NaN or infinity in an analysis's rows or summary is ('' if none)."""
    def walk(x, where):
        if isinstance(x, dict):
            return next((w for k, v in x.items() if (w := walk(v, f"{where}.{k}"))), "")
        if isinstance(x, (list, tuple)):
            return next((w for i, v in enumerate(x) if (w := walk(v, f"{where}[{i}]"))), "")
        return where if isinstance(x, float) and not math.isfinite(x) else ""
    return walk({"rows": result["rows"], "summary": result["summary"]}, "")


def _names(message: str, path: str) -> bool:
    """The message names the input (the folder, or a file inside it)."""
    return path in message or os.path.basename(path) in message


if __name__ == "__main__":
    run_cases(json.loads(Path(sys.argv[1]).read_text()), int(sys.argv[2]) if len(sys.argv) > 2 else 0)
