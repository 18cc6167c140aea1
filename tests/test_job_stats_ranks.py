"""A job of several processes counted right: a real `torchrun --nproc-per-node 2` (gloo, DDP,
torch.compile, CPU) between `fxcache restore` and `fxcache save`, first on an empty scope, then
on what the first saved; the figures equal torch's own counters in each rank."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.test_job_stats import Job

DDP_JOB = """
import json, sys, torch, torch.distributed as dist, torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch._dynamo.utils import counters
dist.init_process_group("gloo")
torch.manual_seed(0)
net = DDP(torch.compile(nn.Sequential(nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 4))))
net(torch.randn(8, 16)).sum().backward()
mine = {k: dict(counters[k]) for k in ("inductor", "aot_autograd")}
with open(f"{sys.argv[1]}/rank{dist.get_rank()}.json", "w") as out:  # one file a rank
    json.dump({"rank": dist.get_rank(), **mine}, out)
# every rank past its collectives before leaving: with torch 2.13 a gloo thread still waiting
# for the GIL to drop the last all-reduce can abort a rank at exit (std::terminate)
dist.barrier()
dist.destroy_process_group()
"""


def _torchrun(job: Job) -> list[dict[str, Any]]:
    """Run the two-rank job; each rank's counters as it wrote them."""
    import subprocess
    import tempfile

    counters = Path(tempfile.mkdtemp(dir=job.script.parent))
    script = job.script.with_name("ddp_job.py")
    script.write_text(DDP_JOB, encoding="utf-8")
    done = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
         "--standalone", str(script), str(counters)],
        env={**job.env, "TORCHINDUCTOR_COMPILE_THREADS": "1", "OMP_NUM_THREADS": "1"},
        capture_output=True, text=True, check=False, timeout=900,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    got = [json.loads(p.read_text()) for p in sorted(counters.glob("rank*.json"))]
    assert [c["rank"] for c in got] == [0, 1]
    return got


def _summed(counters: list[dict[str, Any]], group: str, name: str) -> int:
    return sum(int(c.get(group, {}).get(name, 0)) for c in counters)


@pytest.mark.slow
def test_two_ranks_first_and_second_job(tmp_path: Path) -> None:
    first = Job(tmp_path, "first")
    first.restore()
    ranks = _torchrun(first)
    seen = first.stats()
    assert seen["processes"] == 2 and seen["ranks"] == [0, 1]
    assert seen["fxgraph"]["miss"] == _summed(ranks, "inductor", "fxgraph_cache_miss") == 4
    assert seen["fxgraph"]["hit"] == _summed(ranks, "inductor", "fxgraph_cache_hit")
    assert seen["aotautograd"]["miss"] == _summed(ranks, "aot_autograd", "autograd_cache_miss")
    # both ranks compiled the same two graphs at once: never an entry that vanished
    assert seen["miss_causes"]["entry gone"] == 0, seen["misses"]
    assert seen["miss_causes"]["new graph"] + seen["miss_causes"]["compiled at once"] == 4
    assert {m["rank"] for m in seen["misses"]} == {0, 1}
    line = first.save()
    assert "entry gone" not in line and "entries gone" not in line
    assert "2 processes (ranks 0, 1)" in line
    text = first.fxcache("stats", "--state-file", str(first.state)).stdout
    assert "(rank 0)" in text and "(rank 1)" in text

    second = Job(tmp_path, "second")
    second.restore()
    ranks = _torchrun(second)
    hit = second.stats()
    assert hit["fxgraph"]["hit"] == _summed(ranks, "inductor", "fxgraph_cache_hit") == 4
    assert hit["fxgraph"]["miss"] == _summed(ranks, "inductor", "fxgraph_cache_miss") == 0
    assert hit["aotautograd"]["hit"] == _summed(ranks, "aot_autograd", "autograd_cache_hit")
    assert hit["cross_rank_misses"] == _summed(
        ranks, "aot_autograd", "autograd_cache_cross_rank_miss"
    )
    assert 0 < hit["saved_s"] <= hit["saved_sum_s"]
    from ci_fxcache.report import job_line

    markdown = job_line.summary(hit)
    assert "2 processes (ranks 0, 1)" in markdown
    assert "4 of 4 graphs from the cache" in second.save()
