"""Stand-in for `rocminfo`: prints tests/data/gpu/rocminfo.txt with ROCR_VISIBLE_DEVICES
applied the way ROCr applies it (GPU agents by position or UUID, in the order given; CPU agents
stay; agents renumbered)."""

import os
import re
import sys
from pathlib import Path

text = (Path(__file__).parent / "rocminfo.txt").read_text()
head, *blocks = re.split(r"(?=\*{7}\s*\nAgent \d+)", text)
tail = ""
if blocks and "*** Done ***" in blocks[-1]:
    blocks[-1], tail = blocks[-1].split("*** Done ***", 1)
    tail = "*** Done ***" + tail
cpus = [b for b in blocks if re.search(r"Device Type:\s+CPU", b)]
gpus = [b for b in blocks if re.search(r"Device Type:\s+GPU", b)]
wanted = os.environ.get("ROCR_VISIBLE_DEVICES")
if wanted is not None:
    picked = []
    for entry in (e.strip() for e in wanted.split(",") if e.strip()):
        if entry.isdigit() and int(entry) < len(gpus):
            picked.append(gpus[int(entry)])
        else:
            found = [g for g in gpus if re.search(rf"Uuid:\s+{re.escape(entry)}\s", g)]
            if not found:
                break
            picked.append(found[0])
    gpus = picked
out = [re.sub(r"Agent \d+", f"Agent {n}", b, count=1) for n, b in enumerate(cpus + gpus, 1)]
sys.stdout.write(head + "".join(out) + tail)
