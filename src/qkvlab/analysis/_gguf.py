"""A GGUF file's header, walked and checked before ``gguf.GGUFReader`` sees the file.

The reader trusts every count and length: an array length of 2⁴⁰ in a 300-byte file makes it
loop (reading empty slices past the end) until memory runs out, and a count that points past
the end surfaces as numpy's "index 0 is out of bounds for axis 0 with size 0". This walk reads
the same layout with Python integers and refuses, in words, the first field that does not fit
the file::

    "GGUF" | u32 version (2, 3) | u64 n_tensors | u64 n_kv
    n_kv × (string key | u32 type | value)          value: scalar, string, or
                                                     u32 item type | u64 count | count × value
    n_tensors × (string name | u32 n_dims | n_dims × u64 dim | u32 ggml type | u64 offset)
    padding to general.alignment (default 32) | tensor data
    string = u64 length | utf-8 bytes

Arrays hold scalars or strings (no model qkvlab reads nests them), at most
:data:`MAX_ARRAY_ITEMS` items in all; tensors have 1-4 dimensions, a known ggml type, an aligned
offset, and data that ends inside the file and shares no byte with another tensor's. The
tokenizer's ``bos_token_id`` and ``eos_token_id`` are indices into ``tokenizer.ggml.tokens``.
"""

from __future__ import annotations

import mmap
import struct
from pathlib import Path

from qkvlab.inputs import InputFileError

# value type id -> struct format (GGUFValueType); 8 = string, 9 = array
SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q",
           12: "d"}
STRING, ARRAY = 8, 9
VERSIONS = (2, 3)
MAX_DIMS = 4  # GGML_MAX_DIMS
# The reader keeps one numpy view per array item (about 100 bytes each); the largest tokenizer
# vocabularies in use (256k tokens, with scores, types and merges) stay under a million items.
MAX_ARRAY_ITEMS = 1 << 22
TOKENS = "tokenizer.ggml.tokens"
TOKEN_IDS = ("tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id")


class _Walk:
    def __init__(self, path: Path, buf):
        self.path, self.buf, self.pos = path, buf, 0

    def fail(self, what: str) -> InputFileError:
        return InputFileError(f"{self.path}: corrupt or truncated GGUF header at byte {self.pos}: "
                              f"{what}", path=self.path)

    def need(self, n: int, what: str) -> None:
        if n < 0 or self.pos + n > len(self.buf):
            raise self.fail(f"{what} needs {n:,} bytes; the file ends {len(self.buf) - self.pos:,} "
                            "bytes later (truncated, or a count or length in the header is wrong)")

    def scalar(self, fmt: str, what: str):
        size = struct.calcsize("<" + fmt)
        self.need(size, what)
        (v,) = struct.unpack_from("<" + fmt, self.buf, self.pos)
        self.pos += size
        return v

    def string(self, what: str) -> str:
        n = self.scalar("Q", f"the length of {what}")
        self.need(n, f"{what} ({n:,} bytes)")
        raw = bytes(self.buf[self.pos:self.pos + n])
        self.pos += n
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            raise self.fail(f"{what} is not UTF-8 text") from None


def check_gguf(path: Path, items: int = MAX_ARRAY_ITEMS) -> None:
    """Walk the header of the GGUF file at ``path``; see the module docstring.

    Raises:
        InputFileError: the first field that is malformed or does not fit the file, in words.
    """
    with open(path, "rb") as f:
        try:
            buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        except ValueError:  # an empty file cannot be mapped
            raise InputFileError(f"{path}: empty file", path=path) from None
    try:
        _walk(_Walk(path, buf), items)
    finally:
        buf.close()


def _walk(w: _Walk, items: int) -> None:
    if bytes(w.buf[:4]) != b"GGUF":
        raise w.fail("no 'GGUF' magic")
    w.pos = 4
    version = w.scalar("I", "the version")
    if version not in VERSIONS:
        raise w.fail(f"version {version} is not supported (supported: {list(VERSIONS)})")
    n_tensors = w.scalar("Q", "the tensor count")
    n_kv = w.scalar("Q", "the metadata count")
    left = len(w.buf) - w.pos
    if n_kv > left // 12:  # a key/value pair takes at least 8 + 4 bytes, and more
        raise w.fail(f"{n_kv:,} metadata entries cannot fit in the {left:,} bytes left")
    if n_tensors > left // 28:  # a tensor entry: name length, dims count, 1 dim, type, offset
        raise w.fail(f"{n_tensors:,} tensor entries cannot fit in the {left:,} bytes left")
    keys: dict[str, tuple] = {}  # key -> (value type, value)
    alignment, budget = 32, [items]
    for i in range(n_kv):
        key = w.string(f"metadata key {i}")
        if key in keys:
            raise w.fail(f"metadata key {key!r} appears twice")
        kind = w.scalar("I", f"the type of {key!r}")
        value = _value(w, kind, key, budget)
        keys[key] = kind, value
        if key == "general.alignment":
            if kind != 4 or not 0 < value <= 1 << 16 or value & (value - 1):
                raise w.fail(f"general.alignment = {value!r} must be a uint32 power of two "
                             "up to 65536")
            alignment = value
    _check_token_ids(w.path, keys)
    tensors = []
    names: set[str] = set()
    for i in range(n_tensors):
        name = w.string(f"the name of tensor {i}")
        if name in names:
            raise w.fail(f"tensor {name!r} appears twice")
        names.add(name)
        n_dims = w.scalar("I", f"the dimension count of {name!r}")
        if not 1 <= n_dims <= MAX_DIMS:
            raise w.fail(f"tensor {name!r} has {n_dims:,} dimensions (1 to {MAX_DIMS})")
        dims = [w.scalar("Q", f"a dimension of {name!r}") for _ in range(n_dims)]
        gtype = w.scalar("I", f"the type of {name!r}")
        offset = w.scalar("Q", f"the data offset of {name!r}")
        tensors.append((name, dims, gtype, offset))
    start = -(-w.pos // alignment) * alignment
    _check_tensors(w, tensors, start, alignment)


def _check_token_ids(path: Path, keys: dict) -> None:
    """The special token ids name tokens of the vocabulary (transformers indexes it by them)."""
    kind, n = keys.get(TOKENS, (None, None))
    for key in TOKEN_IDS:
        if key not in keys or kind != ARRAY:
            continue
        v = keys[key][1]
        if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v < n:
            ids = f" (ids 0 to {n - 1:,})" if n else ""
            raise InputFileError(f"{path}: {key} = {v!r} is not a token id: the vocabulary "
                                 f"({TOKENS}) holds {n:,} tokens{ids}", path=path)


def _value(w: _Walk, kind: int, key: str, budget: list[int], depth: int = 0):
    """A scalar's or string's value; an array's item count (its items are only checked)."""
    if kind in SCALARS:
        return w.scalar(SCALARS[kind], f"the value of {key!r}")
    if kind == STRING:
        return w.string(f"the value of {key!r}")
    if kind != ARRAY or depth:
        raise w.fail(f"{key!r} has value type {kind}, which is not a GGUF scalar, string "
                     "or array of them")
    item = w.scalar("I", f"the item type of {key!r}")
    count = w.scalar("Q", f"the length of {key!r}")
    if count > budget[0]:
        raise w.fail(f"{key!r} holds {count:,} items; the header may hold "
                     f"{MAX_ARRAY_ITEMS:,} array items in all")
    budget[0] -= count
    if item in SCALARS:
        w.need(count * struct.calcsize("<" + SCALARS[item]), f"the {count:,} items of {key!r}")
        w.pos += count * struct.calcsize("<" + SCALARS[item])
        return count
    if item != STRING:
        raise w.fail(f"{key!r} is an array of value type {item}: qkvlab reads arrays of "
                     "scalars or strings")
    w.need(8 * count, f"the {count:,} strings of {key!r}")
    for j in range(count):
        w.string(f"string {j} of {key!r}")
    return count


def _check_tensors(w: _Walk, tensors: list, start: int, alignment: int) -> None:
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType  # lazy: optional extra [analysis]

    data = len(w.buf) - start
    ranges = []
    for name, dims, gtype, offset in tensors:
        where = f"tensor {name!r}"
        try:
            qtype = GGMLQuantizationType(gtype)
            block, size = GGML_QUANT_SIZES[qtype]
        except (ValueError, KeyError):
            raise w.fail(f"{where} has unknown ggml type {gtype}") from None
        if any(d < 1 or d > 1 << 40 for d in dims):
            raise w.fail(f"{where} has dimensions {dims}: each must be 1 to 2^40")
        if dims[0] % block:
            raise w.fail(f"{where} ({qtype.name}) has a first dimension of {dims[0]}, not a "
                         f"multiple of its block of {block}")
        count = 1
        for d in dims:
            count *= d
        nbytes = count // block * size
        if offset % alignment:
            raise w.fail(f"{where} starts at offset {offset:,}, not a multiple of the "
                         f"alignment {alignment}")
        if offset + nbytes > data:
            raise w.fail(f"{where} ({qtype.name}, dimensions {dims}) needs {nbytes:,} bytes at "
                         f"offset {offset:,}; the tensor data holds {max(data, 0):,} bytes")
        ranges.append((offset, offset + nbytes, name))
    ranges.sort()
    for a, b in zip(ranges, ranges[1:]):  # sorted by offset: an overlap shows in a neighbour
        if b[0] < a[1]:
            raise InputFileError(f"{w.path}: the data of GGUF tensor {b[2]!r} ({b[1] - b[0]:,} "
                                 f"bytes at offset {b[0]:,}) overlaps that of tensor {a[2]!r} "
                                 f"({a[1] - a[0]:,} bytes at offset {a[0]:,})", path=w.path)
