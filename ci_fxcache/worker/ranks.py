"""A phase's rank under torch.distributed (`--ranks N`, N > 1): the process group, the
DistributedDataParallel wrapper, and the few decisions all ranks must take together.

The runner (ci_fxcache/verify/ranks.py) starts N phases at once, each with `spec["dist"]`:
`rank`, `world_size`, `backend` (gloo on the CPU, nccl on CUDA), `init_method` (a file the
runner names in its scratch: no port is ever assumed free), `timeout_s` (the process group's,
shorter than the phase's, so a rank left waiting for a peer that hangs or died ends on its own)
and `one_rank` (torch.compiler.config.compile_on_one_rank, torch 2.15's compile on one rank).
Without `spec["dist"]` every function here leaves the phase as it was.
"""

from __future__ import annotations

import os
from datetime import timedelta
from typing import Any

import torch

from .torch_options import MissingOption


def active() -> bool:
    """Whether this phase is one rank of several."""
    dist = torch.distributed
    return bool(dist.is_available() and dist.is_initialized())


def setup(spec: dict[str, Any], result: dict[str, Any]) -> None:
    """Join the process group `spec["dist"]` describes (nothing without one)."""
    info = spec.get("dist")
    if not info:
        return
    dist = torch.distributed
    rank, world = int(info["rank"]), int(info["world_size"])
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank))
    result["rank"] = rank
    if info.get("one_rank"):
        import torch.compiler.config as compiler_config

        if not hasattr(compiler_config, "compile_on_one_rank"):
            raise MissingOption("this torch has no torch.compiler.config.compile_on_one_rank")
        compiler_config.compile_on_one_rank = True
    if info["backend"] == "nccl":
        torch.cuda.set_device(0)  # the runner makes one device visible to each rank
    dist.init_process_group(
        info["backend"],
        init_method=info["init_method"],
        rank=rank,
        world_size=world,
        timeout=timedelta(seconds=float(info["timeout_s"])),
    )


# Process groups the phase left, kept from their destructor: a gloo group's destructor joins
# its worker threads while holding the GIL, and a worker thread still waiting for the GIL to drop
# a finished collective (its saved thread state holds a Python object) never gets it, so the rank
# hangs (torch 2.13, a DDP model freed just after `destroy_process_group`). The phase's process
# ends with os._exit, which runs no destructor.
_left_groups: list[Any] = []


def teardown() -> None:
    """Leave the process group (the phase's result is written after this)."""
    if active():
        dist = torch.distributed
        _left_groups.append(dist.group.WORLD)
        dist.destroy_process_group()


def wrapped_already(model: Any) -> bool:
    """Whether the factory returned a model wrapped for data parallelism itself (DDP, FSDP,
    or a module `fully_shard` made an FSDPModule)."""
    from torch.nn.parallel import DistributedDataParallel

    kinds: list[type] = [DistributedDataParallel]
    fsdp = getattr(torch.distributed, "fsdp", None)
    for name in ("FullyShardedDataParallel", "FSDPModule"):
        kind = getattr(fsdp, name, None)
        if isinstance(kind, type):
            kinds.append(kind)
    return isinstance(model, tuple(kinds))


def wrap(model: Any, result: dict[str, Any]) -> Any:
    """The model as the ranks compile it: in DistributedDataParallel, unless the factory
    wrapped it itself or it has no parameter to synchronise (a plain function)."""
    if not active():
        return model
    if wrapped_already(model):
        result["rank_wrapper"] = f"the factory's {type(model).__name__}"
        return model
    trainable = isinstance(model, torch.nn.Module) and any(
        p.requires_grad for p in model.parameters()
    )
    if not trainable:
        result["rank_wrapper"] = "none (no parameters to synchronise)"
        return model
    from torch.nn.parallel import DistributedDataParallel

    result["rank_wrapper"] = "DistributedDataParallel"
    return DistributedDataParallel(model)


def any_rank(flag: bool) -> bool:
    """`flag` of this rank, or'ed over every rank: a step that runs collectives (a DDP model's
    backward) must run on all ranks or on none, or the ones that run it wait forever."""
    if not active():
        return flag
    dist = torch.distributed
    device = "cuda" if dist.get_backend() == "nccl" else "cpu"
    value = torch.tensor([int(flag)], device=device)
    dist.all_reduce(value, op=dist.ReduceOp.MAX)
    return bool(value.item())
