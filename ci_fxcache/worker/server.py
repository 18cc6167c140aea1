"""Fork server: imports torch once (compiling nothing of the user's), then forks one child per
phase; before the first CPU phase, it checks the CPU's vector instructions (_check_vector_isa).

Protocol (JSON lines): the server prints `{"ready": ..., "info": {...}}`; each request line
`{"id", "kind": "phase"|"check"|"identity", "spec", "log", "result"}` is answered by
`{"id", "pid"}` when the child starts and `{"id", "exit": <wait status>}` when it ends. EOF on
stdin: kill what is left and exit.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import sys
import time
from typing import Any

_CACHE_DIR_ENV = "TORCHINDUCTOR_CACHE_DIR"


def _info_in_child() -> dict[str, Any]:
    """Facts about the devices, asked in a throwaway child: querying CUDA in the server itself
    would initialise it, and CUDA does not survive a fork."""
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read_fd)
        code = 1
        try:
            os.write(write_fd, json.dumps(_info()).encode())
            code = 0
        finally:
            os._exit(code)
    os.close(write_fd)
    chunks = []
    while True:
        chunk = os.read(read_fd, 65536)
        if not chunk:
            break
        chunks.append(chunk)
    os.close(read_fd)
    os.waitpid(pid, 0)
    return json.loads(b"".join(chunks) or b"{}")


def _info() -> dict[str, Any]:
    import importlib.util

    import torch

    caps, names = [], []
    if torch.cuda.is_available():
        for i in range(torch.cuda.device_count()):
            caps.append(list(torch.cuda.get_device_capability(i)))
            names.append(torch.cuda.get_device_name(i))
    # getattr: a torch built without distributed (or an old one) still answers with its version
    dist: Any = getattr(torch, "distributed", None)
    distributed = dist is not None and bool(dist.is_available())
    gloo = distributed and bool(dist.is_gloo_available())
    nccl = distributed and bool(caps) and bool(dist.is_nccl_available())
    compiler_config = getattr(getattr(torch, "compiler", None), "config", None)
    return {
        "torch": torch.__version__,
        # what `--ranks` needs (ci_fxcache/verify/ranks.py skip)
        "distributed": distributed,
        "gloo": gloo,
        "nccl": nccl,
        "compile_on_one_rank": hasattr(compiler_config, "compile_on_one_rank"),
        "cuda_capabilities": caps,
        "cuda_names": names,
        "hip": bool(torch.version.hip),
        "redis_module": importlib.util.find_spec("redis") is not None,
        "python": sys.executable,
    }


def _check_vector_isa(request: dict[str, Any]) -> bool:
    """Before the first CPU phase (`request`; True once done, False for any other request):
    Inductor's check of which vector instruction sets this CPU and compiler can build (it
    compiles a probe per set and loads it in a child interpreter: about 0.2 s of CPU per set,
    3-6 sets, in every process that compiles for the CPU), made here so that forked phases
    inherit the answer torch keeps in memory. Into a private cache dir, removed after: the
    probes never land in a phase's cache. Any failure only leaves each phase to check for
    itself, as a process without a server does."""
    combo = (request.get("spec") or {}).get("combo") or {}
    if request.get("kind") != "phase" or combo.get("device") != "cpu":
        return False
    import shutil
    import tempfile

    try:
        private = tempfile.mkdtemp(prefix="fxcache-isa-")
    except OSError:  # no temp dir to write to: not a reason to stop serving
        return True
    before = os.environ.get(_CACHE_DIR_ENV)
    os.environ[_CACHE_DIR_ENV] = private
    try:
        with contextlib.suppress(Exception):  # an older torch, a compiler that fails
            from torch._inductor import cpu_vec_isa

            cpu_vec_isa.pick_vec_isa()
    finally:
        if before is None:
            os.environ.pop(_CACHE_DIR_ENV, None)
        else:
            os.environ[_CACHE_DIR_ENV] = before
        shutil.rmtree(private, ignore_errors=True)
    return True


def _die_with_parent() -> None:
    """Linux: SIGKILL this child when the server dies, so no phase outlives a killed run."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def child(request: dict[str, Any], server_pid: int) -> None:
    """Inside the forked child: own process group, log to a file, run, write the result."""
    os.setpgid(0, 0)
    _die_with_parent()
    if os.getppid() != server_pid:  # the server died before the line above took effect
        os._exit(1)
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, signal.SIG_DFL)
    code = 1
    try:
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        log = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(log, 1)
        os.dup2(log, 2)
        sys.stdout = os.fdopen(1, "w", buffering=1)
        sys.stderr = os.fdopen(2, "w", buffering=1)
        code = execute(request)
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def execute(request: dict[str, Any]) -> int:
    """Run one request in this process and write its result file; the exit code."""
    started = time.perf_counter()
    env = request.get("env") or {}
    for name, value in env.items():
        os.environ[name] = value
    if "TORCHINDUCTOR_COMPILE_THREADS" in env:
        # Inductor read the variable when the server imported its config: set it again
        import torch._inductor.config as inductor_config

        inductor_config.compile_threads = int(env["TORCHINDUCTOR_COMPILE_THREADS"])
    if request["kind"] == "check":
        result = check(request["spec"])
    elif request["kind"] == "identity":
        from . import identify

        result = identify.run(request["spec"])
    else:
        from . import phase

        result = phase.run(request["spec"])
    result["wall_s"] = round(time.perf_counter() - started, 4)
    tmp = request["result"] + ".tmp"
    with open(tmp, "w") as f:
        json.dump(result, f)
    os.replace(tmp, request["result"])
    return 0


def check(spec: dict[str, Any]) -> dict[str, Any]:
    """Import a user workload and call its factory once: catches bad paths and bad shapes early."""
    from . import phase, workloads

    try:
        workloads.build(spec["workload"], phase.DTYPES["float32"], spec["device"])
    except workloads.WorkloadError as exc:
        return {"status": "error", "error": str(exc)}
    return {"status": "ok"}


def _emit(message: dict[str, Any]) -> None:
    os.write(1, (json.dumps(message) + "\n").encode())


def serve() -> None:
    """The server loop."""
    # Import what every phase needs (seconds per process), but compile nothing: the phase
    # sets cache dirs and mechanism config in the child, and Inductor reads the cache dir
    # lazily (cache_dir_utils.cache_dir() reads TORCHINDUCTOR_CACHE_DIR on every call).
    import torch
    import torch._dynamo
    import torch._functorch.aot_autograd
    import torch._inductor.codecache
    import torch._inductor.compile_fx
    import torch._inductor.config

    with contextlib.suppress(ImportError):  # phases note its absence (torch_options)
        import torch._inductor.cpp_builder  # noqa: F401

    _emit({"ready": True, "info": _info_in_child()})
    children: dict[int, Any] = {}

    def stop(signum: int, _frame: Any) -> None:
        for pid in children:
            with contextlib.suppress(OSError):
                os.killpg(pid, signal.SIGKILL)
        os._exit(128 + signum)

    for signum in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        signal.signal(signum, stop)
    pending = b""
    stdin = sys.stdin.fileno()
    open_, isa_checked = True, False
    while open_ or children:
        timeout = 0.05 if children else None
        ready, _, _ = select.select([stdin] if open_ else [], [], [], timeout)
        if ready:
            data = os.read(stdin, 65536)
            if not data:
                open_ = False
                for pid in children:
                    with contextlib.suppress(OSError):
                        os.killpg(pid, signal.SIGKILL)
            pending += data
            while b"\n" in pending:
                line, pending = pending.split(b"\n", 1)
                if not line.strip():
                    continue
                request = json.loads(line)
                isa_checked = isa_checked or _check_vector_isa(request)
                server_pid = os.getpid()
                pid = os.fork()
                if pid == 0:
                    child(request, server_pid)
                children[pid] = request["id"]
                _emit({"id": request["id"], "pid": pid})
        while children:
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                break
            _emit({"id": children.pop(pid), "exit": status})
    # Every message went out with os.write and every child is reaped: skip the interpreter's
    # teardown of torch's modules (about a second the orchestrator would wait for).
    os._exit(0)
