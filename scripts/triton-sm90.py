"""Compile the Triton decode kernel for an H100/H200 (sm_90) without a GPU and print what the
compiled code costs per layout: registers, spill bytes, and the multiply-adds per thread for
every 32 cached tokens, on the kernel's own choice (``triton_decode.uses_dot`` and ``tile``)
beside the padded ``tl.dot`` it replaced for small groups.

    python scripts/triton-sm90.py [--out FILE.md]

Needs the ``triton`` extra (its bundled ``ptxas`` and ``cuobjdump``); no GPU. The counts are
static (the SASS of the tile loop, FFMA for fp32 arithmetic, HMMA/HGMMA for tensor cores),
not timings: they say what each tile asks of the SM, which is what the H200's step time
followed (docs/bench-history.md).
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

os.environ.pop("TRITON_INTERPRET", None)
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from qkvlab.kernels import triton_decode as td  # noqa: E402
from qkvlab.kernels import triton_jit  # noqa: E402
from qkvlab.tables import markdown_table  # noqa: E402

PTR = {"fp32": "*fp32", "bf16": "*bf16"}
INTS = ("skb", "skg", "skt", "svb", "svg", "svt", "scos", "ssin", "G", "T", "CHUNK", "S")
# (name, query heads per kv head, K=V one buffer, rotary): 8 query heads as in the bench
LAYOUTS = [("standard", 1, False, False), ("tied_kv", 1, True, False),
           ("rotary tied_kv", 1, True, True), ("gqa_4", 2, False, False),
           ("gqa_2", 4, False, False), ("mqa", 8, False, False)]


def compiled(dtype: str, R: int, d: int, shared: bool, rotary: bool, dot: bool,
             block_t: int) -> dict:
    """Registers, spill bytes and per-thread FFMA/MMA per 32 tokens of one compiled variant."""
    sig = {n: PTR[dtype] for n in ("Q", "K", "V", "COS", "SIN")}
    sig.update({n: "*fp32" for n in ("M", "L", "ACC")})
    sig.update({n: "i32" for n in INTS})
    const = dict(R=R, DK=d, DV=d, BLOCK_R=td._pow2(R, td.MIN_DOT if dot else 1),
                 BLOCK_T=block_t, BLOCK_DK=td._pow2(d), BLOCK_DV=td._pow2(d),
                 BLOCK_HALF=td._pow2(d // 2), SHARED=shared, ROTARY=rotary,
                 IEEE=dtype == "fp32", DOT=dot)
    sig.update({n: "constexpr" for n in const})
    kernel = triton.compile(ASTSource(triton_jit.partial, sig, const),
                            target=GPUTarget("cuda", 90, 32),
                            options={"num_warps": td.NUM_WARPS})
    bin_dir = Path(triton.__file__).parent / "backends" / "nvidia" / "bin"
    with tempfile.TemporaryDirectory() as tmp:
        ptx, cubin = Path(tmp, "k.ptx"), Path(tmp, "k.cubin")
        ptx.write_text(kernel.asm["ptx"])
        log = subprocess.run([str(bin_dir / "ptxas"), "-v", "-arch=sm_90a", str(ptx), "-o",
                              str(cubin)], capture_output=True, text=True, check=True).stderr
        sass = subprocess.run([str(bin_dir / "cuobjdump"), "-sass", str(cubin)],
                              capture_output=True, text=True, check=True).stdout
    per32 = 32 / block_t
    return {"registers": int(re.search(r"Used (\d+) registers", log).group(1)),
            "spill": int(re.search(r"(\d+) bytes spill stores", log).group(1)),
            "ffma": round(len(re.findall(r"\bFFMA\b", sass)) * per32),
            "mma": round(len(re.findall(r"\bH(?:G)?MMA\b", sass)) * per32)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", help="also write the table here (markdown)")
    args = ap.parse_args(argv)
    rows = []
    for dtype in PTR:
        for d in (64, 128):
            for name, R, shared, rotary in LAYOUTS:
                dot = td.uses_dot(R)
                now = compiled(dtype, R, d, shared, rotary, dot, td.tile(R, d))
                pad = compiled(dtype, R, d, shared, rotary, True, td.BLOCK_T)
                rows.append([dtype, d, name, R, "tl.dot" if dot else "row by row",
                             td.tile(R, d), now["registers"], now["spill"], now["ffma"],
                             now["mma"], pad["registers"], pad["spill"], pad["ffma"],
                             pad["mma"]])
                print(*rows[-1], flush=True, file=sys.stderr)
    table = markdown_table(
        ["dtype", "d", "layout", "heads per kv head", "products", "tile", "registers",
         "spill B", "FFMA / thread / 32 tokens", "MMA / 32 tokens", "padded dot: registers",
         "spill B", "FFMA", "MMA"], rows)
    head = (f"`scripts/triton-sm90.py`, Triton {triton.__version__}, sm_90a, "
            f"{td.NUM_WARPS} warps (static counts of the compiled tile loop, not timings)\n\n")
    print(head + table)
    if args.out:
        Path(args.out).write_text(head + table + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
