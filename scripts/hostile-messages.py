"""Issue 41's hostile and careless-user cases, each with the one line the user sees.

Builds every case of the issue (code a model folder or a spec asks to run, arguments that
hung a sweep, damaged models and stores, outputs that cannot be written, small misses) in a
temporary folder from the test suite's fixture builders (``tests/fuzz_formats.py``,
``tests/fuzz_hostile.py``, ``tests/conftest.py``, ``tests/test_hostile_models.py``), runs the
real command line on it (``qkvlab ...``, or ``python -m qkvlab.train``) as a subprocess with
``OMP_NUM_THREADS=1`` and a 120 s timeout, and prints a Markdown table: the command (temporary
paths as ``TMP/...``), its exit status, how many lines it wrote to stderr and the last of them.
The last column flags what is wrong: a traceback, a timeout, a planted marker file that now
exists, files left beside a store a read command opened.

    .venv/bin/python scripts/hostile-messages.py [--out docs/hostile-inputs.md] [-k TEXT]

Every case is meant to fail at the edge, before any model trains: a timeout means it did not.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))
TIMEOUT = 120
EXPERIMENT = ["lm_gqa", "--profile", "smoke"]  # 3 small runs; every case must stop before them
SWEEP = ["--no-progress", "--workers", "1"]
STUDY = ["--profile", "smoke", "--no-progress", "--no-pretrained", "--workers", "1"]
ANALYZE = ["--quiet", "--no-cka", "--no-figures", "--null", "4"]


# ---- fixtures -----------------------------------------------------------------------------------
def gguf(path: Path, edit=None, **kw) -> Path:
    """The fuzz seed's tiny llama GGUF, its (meta, tensors) passed through ``edit``. The seed
    names no tokenizer model, which ``tiecost``/``convert`` refuse first: a llama one is added
    (its 12 tokens of type 1), so each case meets the check it is about."""
    from fuzz_formats import gguf_bytes, gguf_seed

    meta, tensors = gguf_seed()
    meta += [("tokenizer.ggml.model", 8, "llama"), ("tokenizer.ggml.token_type", 9, (5, [1] * 12))]
    if edit:
        meta, tensors = edit(meta, tensors)
    path.write_bytes(gguf_bytes(meta, tensors, **kw))
    return path


def hf_llama(path: Path, tensors=None, config=None) -> Path:
    """``tiny_hf_llama`` (2 layers, width 16), then ``damage``."""
    from test_hostile_models import damage, tiny_hf_llama

    return damage(tiny_hf_llama(path), tensors, config)


def ct2(folder: Path, scale: float) -> Path:
    """The fuzz seed's CTranslate2 model.bin with its int8 weight's scale set to ``scale``
    (row 0 only for NaN and zero, as test_analysis_bad_input.py does)."""
    import numpy as np
    from fuzz_formats import ct2_bytes, ct2_vars

    v = ct2_vars()
    key = "decoder/layer_0/attention/linear_2/weight"
    if np.isinf(scale):
        v[key + "_scale"][:] = scale
    else:
        v[key + "_scale"][0] = scale
        v[key][0] = 1
    folder.mkdir()
    (folder / "model.bin").write_bytes(ct2_bytes(v))
    return folder / "model.bin"


def damaged_store(path: Path) -> Path:
    """A store with a page of metrics overwritten near its end: fails integrity_check."""
    from conftest import toy_runs
    from qkvlab.experiments.store import Store

    with Store(path) as s:
        (rid,) = s.add("x", "smoke", [(toy_runs()[0][0], {})])
        for step in range(300):
            s.log(rid, step, {f"m{i}": float(i) for i in range(10)})
    raw = bytearray(path.read_bytes())
    size = int.from_bytes(raw[16:18], "big")
    at = (len(raw) // size - 2) * size
    raw[at + 8:at + size] = b"\xab" * (size - 8)
    path.write_bytes(raw)
    return path


def tampered_sweep_store(path: Path) -> Path:
    """lm_gqa's smoke runs, all done but the first, whose stored spec was changed by hand
    (steps 3): it no longer hashes to its id."""
    from qkvlab.experiments.registry import runs_of
    from qkvlab.experiments.store import Store

    with Store(path) as s:
        ids = s.add("lm_gqa", "smoke", runs_of("lm_gqa", "smoke", None))
        for rid in ids[1:]:
            s.finish(rid, "done", 1, {"val_loss": 1.0}, {"n_params": 1})
        spec = s.runs_spec(ids[0])
        spec["train"]["steps"] = 3
        s.conn.execute("UPDATE runs SET spec=? WHERE id=?", (json.dumps(spec), ids[0]))
    return path


def build(tmp: Path) -> list[dict]:
    """Every case: ``name``, ``argv`` (after ``qkvlab``, or a full argv), optional ``env``,
    ``cwd`` and ``after`` (a check run once it exits: a note, or "" when all is well)."""
    from conftest import toy_runs
    from fuzz_hostile import MARKER, plant, store_edits, write_store

    def f(name: str) -> str:
        return str(tmp / name)

    def bad_store(tag: str, raw: bytes) -> str:
        (tmp / tag).write_bytes(raw)
        return f(tag)

    # -- 1: code -------------------------------------------------------------------------------
    planted = tmp / "planted"
    planted.mkdir()
    amap = {"AutoConfig": "modeling_planted.Planted",
            "AutoModelForCausalLM": "modeling_planted.Planted"}
    cfg_code = hf_llama(tmp / "automap-config", config=lambda c: c.update(auto_map=amap))
    tok_code = hf_llama(tmp / "automap-tokenizer")
    tc = json.loads((tok_code / "tokenizer_config.json").read_text())
    tc["auto_map"] = {"AutoTokenizer": ["modeling_planted.Planted", None]}
    (tok_code / "tokenizer_config.json").write_text(json.dumps(tc))
    plant(planted, [cfg_code, tok_code])
    spec = tmp / "planted-spec.json"
    spec.write_text(json.dumps({**toy_runs()[0][0], "task": "planted_fuzz:Evil"}))
    seed = tmp / "seed.db"
    write_store(seed, toy_runs()[0][0])
    edits = dict(store_edits(seed.read_bytes()))
    marker = planted / MARKER

    def no_marker() -> str:
        if marker.exists():
            marker.unlink()
            return "MARKER CREATED: planted code ran"
        return "marker absent"

    # -- 3: damaged models ---------------------------------------------------------------------
    layers = hf_llama(tmp / "layers-4000", config=lambda c: c.update(num_hidden_layers=4000))
    qwen = hf_llama(tmp / "relabelled-qwen2", config=lambda c: c.update(
        model_type="qwen2", architectures=["Qwen2ForCausalLM"]))
    blocks = gguf(tmp / "block-count.gguf", lambda m, t: (
        [(k, ty, v + 1 if k == "llama.block_count" else v) for k, ty, v in m], t))
    no_v = gguf(tmp / "no-attn-v.gguf", lambda m, t: (
        m, [x for x in t if x[0] != "blk.1.attn_v.weight"]))
    overlap = gguf(tmp / "overlap.gguf", infos={"blk.0.attn_q.weight": {"offset": 352}})
    damaged = damaged_store(tmp / "damaged.db")

    # -- 4: one line ---------------------------------------------------------------------------
    nan_q = hf_llama(tmp / "nan-wq", tensors=lambda sd: sd[
        "model.layers.0.self_attn.q_proj.weight"].__setitem__((2, 7), float("nan")))
    bos = gguf(tmp / "bos12.gguf", lambda m, t: ([*m, ("tokenizer.ggml.bos_token_id", 4, 12)], t))
    eos = gguf(tmp / "eos-1.gguf", lambda m, t: ([*m, ("tokenizer.ggml.eos_token_id", 5, -1)], t))
    good = gguf(tmp / "good.gguf")
    (tmp / "a-file").write_text("keep")
    (tmp / "a-dir").mkdir()
    valid = tmp / "valid"
    valid.mkdir()
    write_store(valid / "r.db", toy_runs()[0][0])
    empty = bad_store("empty.db", b"")

    def sidecars() -> str:
        left = sorted(p.name for p in valid.iterdir())
        return "files beside it: " + ", ".join(left) + ("" if left == ["r.db"] else " (LEFT)")

    code_env = {"PYTHONPATH": os.pathsep.join([str(REPO / "src"), str(planted)])}
    return [
        # 1: code runs
        dict(name="auto_map in config.json", argv=["tiecost", str(cfg_code)], after=no_marker),
        dict(name="auto_map in tokenizer_config.json", argv=["tiecost", str(tok_code)],
             after=no_marker),
        dict(name="auto_map in config.json", argv=["analyze", str(cfg_code), *ANALYZE,
                                                   "--out", f("an-automap")], after=no_marker),
        dict(name="auto_map in config.json", argv=["convert", str(cfg_code), "--threads", "1"],
             after=no_marker),
        dict(name="task planted_fuzz:Evil", argv=[sys.executable, "-m", "qkvlab.train",
                                                  str(spec), "--out", f("train-out.json")],
             env=code_env, after=no_marker),
        dict(name="spec not hashing to its id", argv=["results", "all", "--db", bad_store(
            "by-hand.db", edits["store:spec_by_hand"])]),
        dict(name="spec not hashing to its id", argv=["sweep", *EXPERIMENT, "--db", str(
            tampered_sweep_store(tmp / "tampered.db")), *SWEEP, "--threads", "1"]),
        # 2: hangs
        dict(name="--threads -2", argv=["sweep", *EXPERIMENT, "--db", f("t.db"), *SWEEP,
                                        "--threads", "-2"]),
        dict(name="old columns, no primary key", argv=["sweep", *EXPERIMENT, "--db", bad_store(
            "lookalike.db", edits["store:lookalike"]), *SWEEP, "--threads", "1"]),
        dict(name="old columns, no primary key", argv=["study", *STUDY, "--db", f("lookalike.db"),
                                                       "--out", f("reports")]),
        # 3: damaged models
        *[dict(name=name, argv=[cmd, str(src), *extra])
          for name, src in (("config: 4000 layers", layers), ("relabelled as qwen2", qwen),
                            ("GGUF block_count + 1", blocks), ("GGUF without attn_v", no_v),
                            ("GGUF overlapping tensors", overlap))
          for cmd, extra in (("tiecost", []), ("analyze", [*ANALYZE, "--out", f("an-x")]),
                             ("convert", ["--threads", "1"]))
          if cmd != "convert" or str(src).endswith(".gguf")],
        dict(name="store fails integrity_check", argv=["sweep", *EXPERIMENT, "--db", str(damaged),
                                                       *SWEEP, "--threads", "1"]),
        # 4: one line instead of a traceback
        dict(name="NaN in W_Q", argv=["analyze", str(nan_q), *ANALYZE, "--out", f("an-nan")]),
        *[dict(name=f"ct2 int8 scale {x}", argv=["analyze", str(ct2(tmp / f"ct2-{x}", float(x))),
                                                  *ANALYZE, "--out", f(f"an-ct2-{x}")])
          for x in ("nan", "0", "inf")],
        dict(name="GGUF bos_token_id 12 of 12", argv=["tiecost", str(bos)]),
        dict(name="GGUF eos_token_id -1", argv=["tiecost", str(eos)]),
        dict(name="GGUF bos_token_id 12 of 12", argv=["analyze", str(bos), *ANALYZE,
                                                      "--out", f("an-bos")]),
        dict(name="store text not UTF-8", argv=["results", "all", "--db", bad_store(
            "not-utf8.db", edits["store:spec_not_utf8"])]),
        dict(name="--out is a file", argv=["study", *STUDY, "--db", f("s.db"),
                                           "--out", f("a-file")]),
        dict(name="--out /proc/x", argv=["study", *STUDY, "--db", f("s.db"), "--out", "/proc/x"]),
        dict(name="--out is a file", argv=["analyze", str(good), *ANALYZE, "--out", f("a-file")]),
        dict(name="--out is a folder", argv=["results", "all", "--db", str(valid / "r.db"),
                                             "--out", f("a-dir")]),
        dict(name="--dir is a file", argv=["zoo", "fetch", "mpnet", "--quiet",
                                           "--dir", f("a-file")]),
        # 5: small misses
        dict(name="--db names nothing", argv=["results", "all", "--db", f("missing.db")]),
        dict(name="--threads 0", argv=["sweep", *EXPERIMENT, "--db", f("t.db"), *SWEEP,
                                       "--threads", "0"]),
        dict(name="--threads 0", argv=["convert", str(good), "--threads", "0"]),
        dict(name="--device ''", argv=["sweep", *EXPERIMENT, "--db", f("t.db"), *SWEEP,
                                       "--device", ""]),
        dict(name="--device ''", argv=["study", *STUDY, "--db", f("s.db"), "--out", f("reports"),
                                       "--device", ""]),
        dict(name="--device ''", argv=["convert", str(good), "--device", ""]),
        dict(name="--stats nosuch", argv=["results", "all", "--db", str(valid / "r.db"),
                                          "--stats", "nosuch"]),
        *[dict(name="--db is an empty file", argv=[*argv, "--db", empty]) for argv in (
            ["sweep", *EXPERIMENT, *SWEEP], ["study", *STUDY, "--out", f("reports")],
            ["tiecost", str(good)], ["convert", str(good)], ["results", "all"])],
        dict(name="results leaves no -wal/-shm", argv=["results", "all", "--db",
                                                       str(valid / "r.db")], after=sidecars,
             message=True),
    ]


# ---- running ------------------------------------------------------------------------------------
def qkvlab() -> list[str]:
    """The installed ``qkvlab`` script beside this Python (there is no ``qkvlab.__main__``)."""
    if (REPO / "src" / "qkvlab" / "__main__.py").is_file():
        return [sys.executable, "-m", "qkvlab"]
    here = Path(sys.executable).with_name("qkvlab")
    return [str(here if here.is_file() else REPO / ".venv" / "bin" / "qkvlab")]


def run(case: dict, tmp: Path) -> dict:
    argv = case["argv"] if case["argv"][0] == sys.executable else [*qkvlab(), *case["argv"]]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO / "src"),
           **case.get("env", {})}
    cwd = tmp / "cwd"  # a command's default outputs (results/qkvlab.db, analysis/) land here
    cwd.mkdir(exist_ok=True)
    t = time.perf_counter()
    p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         errors="replace", env=env, cwd=cwd, start_new_session=True)
    try:
        out, err = p.communicate(timeout=TIMEOUT)
        status = str(p.returncode)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)  # its own session: the sweep's workers with it
        out, err = p.communicate()
        status = f"timeout ({TIMEOUT} s)"
    took = time.perf_counter() - t
    lines = [ln.rsplit("\r", 1)[-1] for ln in err.strip().split("\n") if ln.strip()]
    notes = [case["after"]()] if "after" in case else []
    if "Traceback" in err:
        notes.append("TRACEBACK")
    if status == "0" and not case.get("message"):  # every other case is bad input
        notes.append("EXIT 0 on bad input")
    shown = ["qkvlab", *case["argv"]] if argv[0] != sys.executable else \
        ["python", *case["argv"][1:]]
    return {"case": case["name"], "command": " ".join(_arg(a) for a in shown),
            "exit": status, "lines": len(lines),
            "last": notes.pop(0) if case.get("message") else (lines[-1] if lines else ""),
            "notes": "; ".join(notes), "seconds": took}


def _arg(a: str) -> str:
    return "''" if a == "" else a


def table(rows: list[dict], tmp: Path) -> str:
    from qkvlab.tables import markdown_table

    def cell(s) -> str:
        s = str(s)
        for t in {str(tmp.resolve()), str(tmp)}:
            s = s.replace(t, "TMP")
        return s

    return markdown_table(["case", "command", "exit", "stderr lines", "last stderr line", "check"],
                          [[r["case"], f"`{r['command']}`", r["exit"], r["lines"], r["last"],
                            r["notes"]] for r in rows], cell=cell) + "\n"


def _preamble(n: int, seconds: float) -> str:
    """What the table is, and where and when it was made (computed, not typed)."""
    from qkvlab.env import cpu_model, git_revision

    return (f"# Hostile and careless input: what each command says\n\n"
            f"Issue 41's cases, {n} of them, each run through the real command line by "
            f"`scripts/hostile-messages.py` (commit {git_revision() or 'unknown'}, "
            f"{time.strftime('%Y-%m-%d')}, {cpu_model() or 'unknown CPU'}, {seconds:.0f} s). "
            "Every case but the last is bad input: it must exit 2 with one line naming what is "
            "wrong, before any model trains, with no planted code run. The last row is a read "
            "command on a valid store, which must leave nothing beside it. Regenerate with "
            "`.venv/bin/python scripts/hostile-messages.py --out docs/hostile-inputs.md`.\n\n")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", help="also write the Markdown table here")
    p.add_argument("-k", dest="only", default="",
                   help="only the cases whose name or command holds this text")
    args = p.parse_args()
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="qkvlab-hostile-") as d:
        tmp = Path(d)
        cases = [c for c in build(tmp)
                 if args.only in c["name"] or args.only in " ".join(c["argv"])]
        rows = []
        for case in cases:
            rows.append(run(case, tmp))
            r = rows[-1]
            print(f"{r['seconds']:6.1f} s  exit {r['exit']:<4} {r['case']}: {r['command']}",
                  file=sys.stderr)
        text = table(rows, tmp)
    print(text, end="")
    print(f"{len(rows)} cases in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    if args.out:
        Path(args.out).write_text(_preamble(len(rows), time.perf_counter() - t0) + text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
