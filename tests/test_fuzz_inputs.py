"""Fuzz: damaged copies of every format qkvlab parses end in one clean error, or load.

Seeds and damage are in ``fuzz_inputs``/``fuzz_fields``: truncations, bit flips, and header
fields set to 0, negative, huge and wrong-typed values, for safetensors (qkvlab checkpoints,
training checkpoints, HF weights), GGUF (float and Q8_0), ONNX, CTranslate2, Marian, HF config
folders (BERT, GPT-2, Llama, Whisper), run specs, tokenizer JSON (char, BPE) and results stores,
plus the hostile edits of ``fuzz_hostile`` that keep a file well formed (non-finite values, deep
exponent flips, inconsistent configs, planted code, stores changed by hand or look-alikes). A separate
process reads them under an address-space cap and with ``QKVLAB_MAX_MEMORY`` low; each case
must end as a load or an ``InputFileError`` naming the file, within the time limit, under the
cap, without reaching an unpickler, running planted code or measuring a NaN; the hostile edits
that damage a model or ask for code must be refused. The default run takes well under a minute on 2 cores;
``-m slow`` adds 200 truncations and 1,000 bit flips per format (about 20,000 inputs).
"""

from __future__ import annotations

import json
import os
import queue
import re
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
CASE_TIMEOUT_S = 20.0  # generous on a loaded 2-core machine; a clean refusal takes milliseconds
GOOD = ("load", "clean")
REFUSE = re.compile(r"(nan|inf|scale=(nan|inf)|code|store:(spec|lookalike|stranger|empty)).*:?")


def _lines(proc, q):
    for line in proc.stdout:
        q.put(line)
    q.put(None)


def run_fuzz(cases_file: Path, n: int, log: Path) -> dict[int, dict]:
    """Every case's record; a case that hangs or kills the reader is recorded as such and the
    reader restarts after it."""
    env = {**os.environ, "QKVLAB_MAX_MEMORY": "512M", "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(HERE.parent / "src"), str(HERE),
                                          os.environ.get("PYTHONPATH", "")])}
    results: dict[int, dict] = {}
    start = 0
    with open(log, "a") as err:
        while start < n:
            proc = subprocess.Popen([sys.executable, str(HERE / "fuzz_inputs.py"), str(cases_file),
                                     str(start)], stdout=subprocess.PIPE, stderr=err, text=True,
                                    env=env)
            q: queue.Queue = queue.Queue()
            threading.Thread(target=_lines, args=(proc, q), daemon=True).start()
            current, deadline, start = None, time.monotonic() + 120, n
            while True:
                try:
                    line = q.get(timeout=max(0.1, deadline - time.monotonic()))
                except queue.Empty:  # the current case hangs (or the start-up did)
                    proc.kill()
                    proc.wait()
                    if current is None:
                        raise AssertionError(f"the fuzz reader did not start; see {log}") from None
                    results[current] = {"outcome": "hang", "error": f"over {CASE_TIMEOUT_S} s"}
                    start = current + 1
                    break
                if line is None:  # the reader exited
                    rc = proc.wait()
                    if current is not None:
                        results[current] = {"outcome": "died", "error": f"exit status {rc}"}
                        start = current + 1
                    elif rc:
                        raise AssertionError(f"the fuzz reader exited with {rc}; see {log}")
                    break
                rec = json.loads(line)
                if "start" in rec:
                    current, deadline = rec["start"], time.monotonic() + CASE_TIMEOUT_S
                elif "outcome" in rec:
                    results[rec["i"]] = rec
                    current = None
                else:  # ready
                    deadline = time.monotonic() + CASE_TIMEOUT_S
    return results


def fuzz(tmp_path: Path, slow: bool) -> tuple[list[dict], dict[int, dict]]:
    import fuzz_inputs

    seed_map = fuzz_inputs.seeds(tmp_path / "seeds")
    items = fuzz_inputs.cases(tmp_path / "cases", seed_map, slow=slow)
    items += fuzz_inputs.self_checks(tmp_path)
    cases_file = tmp_path / "cases.json"
    cases_file.write_text(json.dumps(items))
    return items, run_fuzz(cases_file, len(items), tmp_path / "reader.log")


def check(items: list[dict], results: dict[int, dict], capsys) -> None:
    own = [i for i, c in enumerate(items) if c["reader"] == "allocate"]
    assert [results.get(i, {}).get("outcome") for i in own] == ["over_cap"] * len(own), \
        "the harness's memory cap did not catch its own over-allocations"
    results = {i: r for i, r in results.items() if i not in own}
    items = [c for c in items if c["reader"] != "allocate"]
    counts = Counter(r["outcome"] for r in results.values())
    bad = [(items[i]["id"], r["outcome"], r.get("error", "")[:300])
           for i, r in sorted(results.items()) if r["outcome"] not in GOOD]
    line = (f"fuzz: {len(items)} inputs tried, {counts['clean']} clean errors, "
            f"{counts['load']} loads, {len(bad)} crashed, hung, unnamed, unpickled or over the "
            f"memory cap ({dict(counts)}); slowest case "
            f"{max((r.get('seconds', 0) for r in results.values()), default=0):.2f} s, largest "
            f"peak {max((r.get('peak_mb', 0) for r in results.values()), default=0):.0f} MiB")
    with capsys.disabled():
        print("\n" + line)
    assert len(results) == len(items), line
    assert not bad, line + "\n" + "\n".join(map(str, bad[:30]))
    intact = [results[i]["outcome"] for i, c in enumerate(items) if c["id"].endswith("/intact")]
    assert intact and set(intact) == {"load"}, "every undamaged seed must load"
    assert counts["clean"] > len(items) // 2
    # what must be refused, not survived: a NaN or an infinity in a weight or a scale (the
    # model is damaged), code asked for, a stored spec that no longer hashes to its id, a file
    # that only looks like a store
    must = [(items[i]["id"], r["outcome"]) for i, r in sorted(results.items())
            if REFUSE.match(items[i]["id"].split("/", 1)[1])]
    missed = [f"{i} ({o})" for i, o in must if o != "clean"]
    assert len(must) > 100 and not missed, f"{len(missed)} not refused: " + ", ".join(missed)


def test_fuzz_every_format_fast(tmp_path, capsys):
    check(*fuzz(tmp_path, slow=False), capsys)


@pytest.mark.slow
def test_fuzz_every_format_long(tmp_path, capsys):
    check(*fuzz(tmp_path, slow=True), capsys)
