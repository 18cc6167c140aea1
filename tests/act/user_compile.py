"""The user's own compile step in the act end-to-end workflow: compiles sin_matmul (inference)
under whatever TORCHINDUCTOR_CACHE_DIR the fxcache action exported, and records the FX graph
cache counters, so the test can tell whether the restored cache served the user's compile."""

import json
import os
import sys
import time

import torch
from torch._dynamo.utils import counters


def main() -> None:
    torch.manual_seed(0)
    x, y = torch.randn(100, 100), torch.randn(100, 100)
    fn = torch.compile(lambda a, b: a.sin() @ b)
    start = time.perf_counter()
    with torch.no_grad():
        fn(x, y)
    elapsed = time.perf_counter() - start
    doc = {
        "compile_s": elapsed,
        "cache_dir": os.environ.get("TORCHINDUCTOR_CACHE_DIR"),
        "inductor": dict(counters["inductor"]),
    }
    with open(sys.argv[1], "w") as fh:
        json.dump(doc, fh)


if __name__ == "__main__":
    main()
