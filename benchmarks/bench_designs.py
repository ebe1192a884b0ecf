"""Forward+backward time of each design's attention layer relative to `standard`,
beside the FLOPs ratio it should follow (tied designs save projection FLOPs).

    python benchmarks/bench_designs.py [--size small|large] [--rounds N]
"""

import argparse

from qkvlab.bench import bench_attention

if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--size", default="large", choices=["small", "large"])
    ap.add_argument("--rounds", type=int, default=5)
    a = ap.parse_args()
    print("| design | time / standard | FLOPs / standard |\n|---|---|---|")
    for d, r in bench_attention(a.size, rounds=a.rounds).items():
        print(f"| {d} | {r['time_vs_standard']:.2f} | {r['flops_vs_standard']:.2f} |")
