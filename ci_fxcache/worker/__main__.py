"""`python -m <worker> serve` (fork server) or `python -m <worker> phase REQUEST.json`."""

from __future__ import annotations

import json
import sys

from . import server

if __name__ == "__main__":
    if sys.argv[1:] == ["serve"]:
        server.serve()
    elif len(sys.argv) == 3 and sys.argv[1] == "phase":
        with open(sys.argv[2]) as f:
            sys.exit(server.execute(json.load(f)))
    else:
        sys.exit("usage: python -m <worker> serve | phase REQUEST.json")
