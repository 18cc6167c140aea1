"""The orchestrator's side of the fork server that runs in the user's interpreter.

Only the worker package is made importable there: a private temp dir holding a symlink to it
(under the name `_fxcache_worker`) is prepended to PYTHONPATH; the toolkit's own site-packages
never are. `python -m` keeps the current directory on sys.path, so user workloads
(`package.module:factory`) import exactly as they would in the user's job.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import queue
import shutil
import signal
import subprocess
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from ci_fxcache import names
from ci_fxcache.errors import UsageError

WORKER_NAME = "_fxcache_worker"
WORKER_DIR = Path(__file__).resolve().parents[1] / "worker"
START_TIMEOUT_S = 300.0


@dataclass
class Outcome:
    """How one child ended: its result (None when it wrote none), exit code or signal, log tail."""

    result: dict[str, Any] | None
    returncode: int | None
    signal: str | None
    timed_out: bool
    log_tail: str


def log_tail(path: Path, lines: int = 15) -> str:
    """The last lines of a log file ('' when there is none)."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.rstrip().splitlines()[-lines:])


def worker_env(base: dict[str, str] | None = None) -> tuple[dict[str, str], str]:
    """Environment for the worker (the job's, without any secret or runner file command: it
    imports the user's workloads), and the private dir that makes it importable. Never the
    job's TORCH_TRACE, whatever its value: the matrix's compiles are not the job's own, and
    never land in a trace the user named (worker/keyinfo.py hears torch's trace logger
    without it)."""
    env = names.without_secrets(os.environ if base is None else base)
    env.pop(names.TORCH_TRACE_ENV, None)
    private = tempfile.mkdtemp(prefix="fxcache-worker-")
    os.symlink(WORKER_DIR, os.path.join(private, WORKER_NAME))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (private, env.get("PYTHONPATH", "")) if p)
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env, private


class ForkServer:
    """One `python -m _fxcache_worker serve` process; `run()` is safe to call from threads."""

    def __init__(self, python: str, log_dir: Path) -> None:
        env, self._private = worker_env()
        self.log = log_dir / "server.log"
        self._stderr: IO[bytes] = open(self.log, "wb")  # noqa: SIM115 (closed in close())
        try:
            self._proc = subprocess.Popen(
                [python, "-m", WORKER_NAME, "serve"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=self._stderr,
                env=env,
            )
        except OSError as exc:
            self.close()
            raise UsageError(f"--python {python}: cannot run it ({exc.strerror})") from exc
        self._lock = threading.Lock()
        self._gone = False  # the server's stdout ended, or `stop` ran: no request is answered
        self._ids = itertools.count(1)
        self._waiters: dict[int, queue.Queue[dict[str, Any]]] = {}
        self._ready: queue.Queue[dict[str, Any] | None] = queue.Queue()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        try:
            first = self._ready.get(timeout=START_TIMEOUT_S)
        except queue.Empty:
            first = None
        except BaseException:  # interrupted while torch imports
            self._proc.kill()
            self.close()
            raise
        if not first:
            tail = log_tail(self.log, 3) or "no output"
            self.close()
            raise UsageError(
                f"--python {python}: the worker did not start (is torch installed there?): "
                f"{tail.splitlines()[-1]}"
            )
        self.info: dict[str, Any] = first["info"]

    def _read(self) -> None:
        assert self._proc.stdout is not None
        for raw in self._proc.stdout:
            try:
                message = json.loads(raw)
            except json.JSONDecodeError:
                continue
            if message.get("ready"):
                self._ready.put(message)
                continue
            with self._lock:
                waiter = self._waiters.get(message.get("id", -1))
            if waiter is not None:
                waiter.put(message)
        self._ready.put(None)
        with self._lock:
            self._gone = True
            for waiter in self._waiters.values():
                waiter.put({"gone": True})

    def run(
        self,
        kind: str,
        spec: dict[str, Any],
        work_dir: Path,
        name: str,
        timeout: float,
        env: dict[str, str] | None = None,
    ) -> Outcome:
        """Fork a child for one request; kill its process group when it outlives `timeout`."""
        work_dir.mkdir(parents=True, exist_ok=True)
        log, result = work_dir / f"{name}.log", work_dir / f"{name}.json"
        for path in (log, result):
            path.unlink(missing_ok=True)
        request_id = next(self._ids)
        waiter: queue.Queue[dict[str, Any]] = queue.Queue()
        request = {
            "id": request_id,
            "kind": kind,
            "spec": spec,
            "env": env or {},
            "log": str(log),
            "result": str(result),
        }
        with self._lock:
            self._waiters[request_id] = waiter
            assert self._proc.stdin is not None
            try:
                if self._gone:
                    raise BrokenPipeError
                self._proc.stdin.write((json.dumps(request) + "\n").encode())
                self._proc.stdin.flush()
            except OSError:
                waiter.put({"gone": True})
        started = waiter.get()
        timed_out = False
        status: int | None = None
        if "pid" in started:
            try:
                ended = waiter.get(timeout=timeout)
            except queue.Empty:
                timed_out = True
                with contextlib.suppress(OSError):
                    os.killpg(started["pid"], signal.SIGKILL)
                ended = waiter.get()
            status = ended.get("exit")
        with self._lock:
            del self._waiters[request_id]
        return _outcome(status, result, log, timed_out)

    def stop(self) -> None:
        """Kill every running child now (an interrupted run): SIGTERM makes the server SIGKILL
        their process groups (compile workers included) and exit; every waiting `run`
        returns at once and no new request is sent."""
        with self._lock:
            self._gone = True
            for waiter in self._waiters.values():
                waiter.put({"gone": True})
        with contextlib.suppress(OSError):
            self._proc.send_signal(signal.SIGTERM)

    def close(self) -> None:
        """Stop the server (its children are killed when stdin closes)."""
        proc = getattr(self, "_proc", None)
        if proc is not None:
            try:
                if proc.stdin:
                    proc.stdin.close()
                proc.wait(timeout=30)
            except (OSError, subprocess.TimeoutExpired):
                proc.kill()
                proc.wait()
        self._stderr.close()
        shutil.rmtree(self._private, ignore_errors=True)


def _outcome(status: int | None, result: Path, log: Path, timed_out: bool) -> Outcome:
    code: int | None = None
    sig: str | None = None
    if status is not None:
        code = os.waitstatus_to_exitcode(status)
        if code < 0:
            try:
                sig = signal.Signals(-code).name
            except ValueError:
                sig = f"signal {-code}"
    data: dict[str, Any] | None = None
    if not timed_out and result.exists():
        try:
            data = json.loads(result.read_text())
        except (OSError, json.JSONDecodeError):
            data = None
    return Outcome(data, code, sig, timed_out, log_tail(log))
