"""The fuzz corpus's hostile cases (issue 41): damage that keeps a file well formed.

A bit flip or a cut mostly breaks a header; these leave every header intact and change what a
careful reader must still refuse or survive:

- **values**: a NaN or an infinity in a weight, a deep exponent flip (bit 30 of a float32, which
  turns a weight in [1, 2) into an infinity and one in [0.5, 1) into ~1e38), a quantization scale
  that is NaN, infinite or zero;
- **consistency**: a config's or a GGUF header's integer off by one or doubled (more layers than
  the file holds, heads that no longer divide the width);
- **code**: an HF config asking for its own code (``auto_map``, ``trust_remote_code``) with that
  code planted beside it, and run specs naming a module as their task (a planted module, the
  standard library's ``this``, ``os``);
- **stores**: a qkvlab results store with a planted-task run (honestly hashed), changed by hand,
  swapped for an old-store look-alike or another program's database, or cut and flipped by the
  generic damage.

Planted code leaves ``MARKER`` (beside the seeds) when it runs; the reader reports any case after
which it exists, or after which a planted module is imported, as ``executed``.
"""

from __future__ import annotations

import json
import sqlite3
import struct
import tempfile
from pathlib import Path

import numpy as np
from fuzz_formats import ct2_bytes, ct2_vars, gguf_bytes, gguf_seed, marian_bytes, marian_items

MARKER = "executed"  # beside the seeds: planted code writes it when anything imports or runs it
PLANTED = ("planted_fuzz", "this")  # modules no case may import
CODE_TASKS = ["planted_fuzz:Evil", "this:s", "os:system"]


def plant(root: Path, folders: list[Path]) -> None:
    """The planted module (importable from ``root``) and a ``modeling_planted.py`` in each HF
    folder; both write ``root/MARKER`` when run."""
    code = f"open({str(root / MARKER)!r}, 'w').write(__name__)\n"
    (root / "planted_fuzz.py").write_text(code + "class Evil: pass\n")
    for f in folders:
        (f / "modeling_planted.py").write_text(code + "class Planted: pass\n")


# ---- values -------------------------------------------------------------------------------------
NAN32, INF32 = struct.pack("<f", float("nan")), struct.pack("<f", float("inf"))


def _flip30(b: bytes) -> bytes:
    x = struct.unpack("<I", b)[0] ^ (1 << 30)
    return struct.pack("<I", x)


def _float_edits(data: bytes, tag: str) -> list[tuple[str, bytes]]:
    """NaN at the first float32 of ``data``, +inf at the last, bit 30 flipped in the middle."""
    mid = (len(data) // 8) * 4
    return [(f"nan:{tag}", NAN32 + data[4:]), (f"inf:{tag}", data[:-4] + INF32),
            (f"exp:{tag}", data[:mid] + _flip30(data[mid:mid + 4]) + data[mid + 4:])]


def safetensors_values(raw: bytes) -> list[tuple[str, bytes]]:
    n = int.from_bytes(raw[:8], "little")
    header, base = json.loads(raw[8:8 + n]), 8 + n
    out = []
    for name, info in sorted(header.items()):
        if name == "__metadata__" or info["dtype"] != "F32":
            continue
        a, b = (base + o for o in info["data_offsets"])
        out += [(t, raw[:a] + d + raw[b:]) for t, d in _float_edits(raw[a:b], name)]
    return out


def gguf_values(q8: bool, seed=None) -> list[tuple[str, bytes]]:
    meta, tensors = seed or gguf_seed(q8)
    out = []
    for j, (name, dims, gtype, data) in enumerate(tensors):
        if not name.startswith("blk.0.attn_") or "norm" in name:
            continue  # the projections: norms are read only by the CKA (checked there)
        if gtype == 0:
            edits = _float_edits(data, name)
        else:  # Q8_0 blocks: a float16 scale, then 32 int8 values
            edits = [(f"scale={v}:{name}", struct.pack("<e", float(v)) + data[2:])
                     for v in ("nan", "inf", 0)]
        out += [(t, gguf_bytes(meta, tensors[:j] + [(name, dims, gtype, d)] + tensors[j + 1:]))
                for t, d in edits]
    return out


def ct2_values() -> list[tuple[str, bytes]]:
    v = ct2_vars()
    scale = "decoder/layer_0/attention/linear_2/weight_scale"
    w = "encoder/layer_0/self_attention/linear_0/weight"
    out = [(f"scale={x}:{scale}", ct2_bytes(dict(v, **{scale: np.full_like(v[scale], x)})))
           for x in (np.nan, np.inf, 0.0)]
    for tag, d in _float_edits(v[w].tobytes(), w):
        out.append((tag, ct2_bytes(dict(v, **{w: np.frombuffer(d, np.float32).reshape(v[w].shape)}))))
    return out


def marian_values() -> list[tuple[str, bytes]]:
    items = marian_items()
    name, typ, shape, data = items[0]  # int8 weights, then their float32 multiplier
    at = shape[0] * shape[1]
    out = [(f"scale={x}:{name}", marian_bytes([(name, typ, shape, data[:at] + struct.pack("<f", x)
                                                + data[at + 4:])] + items[1:]))
           for x in (float("nan"), float("inf"), 0.0)]
    bname, btyp, bshape, bdata = items[1]
    out += [(t, marian_bytes(items[:1] + [(bname, btyp, bshape, d)] + items[2:]))
            for t, d in _float_edits(bdata, bname)]
    return out


# ---- consistency and code -----------------------------------------------------------------------
def config_edits(raw: bytes) -> list[tuple[str, bytes]]:
    """Each integer of an HF config off by one and doubled; ``auto_map``/``trust_remote_code``
    asking for the planted code."""
    cfg = json.loads(raw)
    out = []
    for k, v in cfg.items():
        if isinstance(v, int) and not isinstance(v, bool):
            out += [(f"cfg:{k}={x}", json.dumps({**cfg, k: x}).encode()) for x in (v + 1, v - 1, 2 * v)]
    code = {"auto_map": {"AutoConfig": "modeling_planted.Planted",
                         "AutoModel": "modeling_planted.Planted"}}
    out += [("code:auto_map", json.dumps({**cfg, **code, "model_type": "planted"}).encode()),
            ("code:auto_map_known_type", json.dumps({**cfg, **code}).encode()),
            ("code:trust_remote_code", json.dumps({**cfg, "trust_remote_code": True}).encode())]
    return out


def gguf_consistency(q8: bool, seed=None) -> list[tuple[str, bytes]]:
    meta, tensors = seed or gguf_seed(q8)
    out = []
    for j, (key, kind, v) in enumerate(meta):
        if kind == 4:
            for x in (v + 1, v - 1, 2 * v):
                out.append((f"gguf:{key.split('.', 1)[1]}={x}",
                            gguf_bytes(meta[:j] + [(key, kind, x)] + meta[j + 1:], tensors)))
    return out


def spec_code(raw: bytes) -> list[tuple[str, bytes]]:
    spec = json.loads(raw)
    return [(f"code:task={t}", json.dumps({**spec, "task": t}).encode()) for t in CODE_TASKS]


# ---- stores -------------------------------------------------------------------------------------
def write_store(path: Path, spec: dict) -> Path:
    """A small qkvlab store: a finished run with metrics, a planted-task run, a measure row."""
    from qkvlab.experiments.store import Store

    with Store(path) as s:
        done, planted = s.add("fuzz", "smoke", [(spec, {"design": "tied_kv"}),
                                                ({**spec, "task": CODE_TASKS[0]}, {})])
        for step in range(20):
            s.log(done, step, {"loss": 3.0 - step / 10, "val_loss": 3.1 - step / 20})
        s.finish(done, "done", 20, {"val_loss": 2.2}, {"n_params": 100})
        s.fail(planted, "refused")
        s.measure("fuzz", {"model": "x"}, lambda: [{"x": 1.0}, {"x": 2.0}])
    return path


def _db_bytes(build) -> bytes:
    with tempfile.TemporaryDirectory() as d:
        p = Path(d) / "x.db"
        c = sqlite3.connect(p)
        build(c)
        c.commit()
        c.close()
        return p.read_bytes()


def store_edits(raw: bytes) -> list[tuple[str, bytes]]:
    """The store changed by hand, and files that only look like one."""
    from qkvlab.experiments.schema import LEGACY_RUNS

    def edited(sql: str) -> bytes:
        with tempfile.TemporaryDirectory() as d:
            p = Path(d) / "s.db"
            p.write_bytes(raw)
            c = sqlite3.connect(p)
            c.execute(sql)
            c.commit()
            c.close()
            return p.read_bytes()

    return [
        ("store:spec_by_hand", edited("UPDATE runs SET spec=json_set(spec, '$.task', 'lm')")),
        ("store:spec_not_json", edited("UPDATE runs SET spec='{not json'")),
        ("store:spec_not_utf8", edited("UPDATE runs SET spec=CAST(x'fffe7b7d' AS TEXT)")),
        ("store:status_unknown", edited("UPDATE runs SET status='exploded'")),
        ("store:no_members", edited("DROP TABLE members")),
        ("store:lookalike", _db_bytes(lambda c: (
            c.execute(f"CREATE TABLE runs ({', '.join(sorted(LEGACY_RUNS))})"),
            c.execute("INSERT INTO runs (id, spec) VALUES ('a', 'x'), ('a', 'y')")))),
        ("store:stranger", _db_bytes(lambda c: (
            c.execute("CREATE TABLE runs (id INTEGER PRIMARY KEY, name TEXT)"),
            c.execute("INSERT INTO runs (name) VALUES ('mine')")))),
        ("store:empty", b""),
    ]


def read_store(path) -> None:
    """What ``results`` reads, then what a sweep does before it trains: open for writing, read
    every spec, refuse the tasks nobody opted in to, log a step. A refused store must be left
    byte for byte as it was, with nothing beside it."""
    import hashlib

    from qkvlab.experiments.store import Store
    from qkvlab.inputs import InputFileError
    from qkvlab.train.build import check_task_name

    path = Path(path)

    def state():
        return (hashlib.sha256(path.read_bytes()).hexdigest() if path.exists() else None,
                sorted(p.name for p in path.parent.iterdir()))

    before = state()
    try:
        with Store(path, readonly=True) as s:
            rows = s.runs()
            for r in rows:
                s.runs_spec(r["id"])
                s.metrics(r["id"])
            s.measure_rows()
        with Store(path) as s:
            for r in s.runs():
                try:
                    check_task_name(s.runs_spec(r["id"])["task"])
                except ValueError:
                    continue  # refused, as a worker refuses it, with nothing imported
                s.log(r["id"], 999, {"fuzz": 1.0})
    except InputFileError:
        if state() != before:
            raise RuntimeError(f"{path}: a store refused as damaged was changed") from None
        raise
