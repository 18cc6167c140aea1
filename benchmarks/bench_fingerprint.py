"""`fxcache fingerprint` versus `import torch`, measured side by side in one run.

Usage: python benchmarks/bench_fingerprint.py [--python PY] [--repeat N]
Prints the median wall time of each and the ratio (target: fingerprint < 0.3 s).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time


def _median_wall(argv: list[str], repeat: int) -> float:
    samples = []
    for _ in range(repeat):
        start = time.perf_counter()
        subprocess.run(argv, check=True, capture_output=True)
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--python", default=sys.executable, help="interpreter with torch")
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()
    fxcache = [sys.executable, "-m", "ci_fxcache", "fingerprint", "--python", args.python]
    torch_import = [args.python, "-c", "import torch"]
    # interleave warm-ups so both see the same page-cache state
    _median_wall(fxcache, 1)
    _median_wall(torch_import, 1)
    fp = _median_wall(fxcache, args.repeat)
    imp = _median_wall(torch_import, args.repeat)
    print(f"fxcache fingerprint : {fp:.3f} s (median of {args.repeat})")
    print(f"python -c 'import torch': {imp:.3f} s (median of {args.repeat})")
    print(f"ratio fingerprint / import torch: {fp / imp:.3f}  ({imp / fp:.1f}x faster)")
    print(f"target fingerprint < 0.300 s: {'met' if fp < 0.3 else 'MISSED'}")


if __name__ == "__main__":
    main()
