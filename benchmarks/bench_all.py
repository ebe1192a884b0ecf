"""Run every core benchmark and print the tables (same as `qkvlab bench`).

    python benchmarks/bench_all.py [--size small|large|all] [--quick] [--no-peers]

Each figure is a ratio measured side by side in one run (contenders interleaved, median over
rounds): absolute times on a shared machine mean little. See src/qkvlab/bench.py.
"""

import sys

from qkvlab.cli import main

if __name__ == "__main__":
    sys.exit(main(["bench", *sys.argv[1:]]))
