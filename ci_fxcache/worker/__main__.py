"""`python -m <worker> serve` (fork server) or `python -m <worker> phase REQUEST.json`."""

from __future__ import annotations

import json
import os
import sys

from . import server

if __name__ == "__main__":
    if sys.argv[1:] == ["serve"]:
        server.serve()
    elif len(sys.argv) == 3 and sys.argv[1] == "phase":
        with open(sys.argv[2]) as f:
            code = server.execute(json.load(f))
        # The result file is written: leave without tearing torch's modules down (seconds for
        # a rank with a process group, as the fork server's children leave).
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    else:
        sys.exit("usage: python -m <worker> serve | phase REQUEST.json")
