"""scripts/install-toolkit.sh run as the action runs it: locked, hash-checked dependencies in
the toolkit's own venv, reused only after an integrity check, never reused by untrusted
events, the redis extra only for store redis, and a preinstalled toolkit used as it is."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ci_fxcache import __version__
from tests.conftest import ROOT, TORCH_PYTHON
from tests.test_action_steps import read_file_vars

pytestmark = pytest.mark.slow
INSTALL = ROOT / "scripts" / "install-toolkit.sh"


@pytest.fixture
def action(tmp_path: Path) -> Path:
    """A copy of what the action ships (sources, lock files, the script)."""
    dest = tmp_path / "action"
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for rel in ("ci_fxcache", "toolkit", "scripts"):
        shutil.copytree(ROOT / rel, dest / rel, ignore=ignore)
    return dest


def install(
    action: Path, tmp_path: Path, **env: str
) -> tuple[subprocess.CompletedProcess[str], str]:
    out = tmp_path / "output"
    out.write_text("")
    full = {k: v for k, v in os.environ.items() if not k.startswith(("GITHUB_", "FXCACHE_"))}
    full.update(
        {
            "FXCACHE_ACTION_ROOT": str(action),
            "FXCACHE_BASE_PYTHON": TORCH_PYTHON,
            "RUNNER_TOOL_CACHE": str(tmp_path / "tool-cache"),
            "RUNNER_TEMP": str(tmp_path / "runner-temp"),
            "GITHUB_OUTPUT": str(out),
        }
    )
    full.update(env)
    proc = subprocess.run(["bash", str(action / "scripts/install-toolkit.sh")], env=full,
                          capture_output=True, text=True, check=False, timeout=600)  # fmt: skip
    return proc, read_file_vars(out).get("fxcache", "")


def _imports(exe: str, module: str) -> bool:
    python = Path(exe).with_name("python")
    return subprocess.run([str(python), "-c", f"import {module}"], capture_output=True,
                          check=False).returncode == 0  # fmt: skip


# Every interpreter and machine the lock is for (toolkit/lock.py; requires-python >= 3.11):
# 3.11's patch releases apart, since a dependency may differ below one (redis below 3.11.3).
LOCKED_FOR = [
    {"python_version": v.rsplit(".", 1)[0], "python_full_version": v, "platform_machine": m}
    for v in ("3.11.0", "3.11.2", "3.11.3", "3.12.0", "3.13.0")
    for m in ("x86_64", "aarch64")
]


def _missing_dependencies(exe: str) -> list[str]:
    """What an installed toolkit's distributions require on any interpreter the lock is for
    that the toolkit's environment lacks (a dependency the lock left out)."""
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    script = (
        "import json, importlib.metadata as m\n"
        "print(json.dumps({d.metadata['Name']: d.requires or [] for d in m.distributions()}))"
    )
    python = Path(exe).with_name("python")
    found = json.loads(subprocess.run([str(python), "-c", script], capture_output=True,
                                      text=True, check=True).stdout)  # fmt: skip
    installed = {canonicalize_name(name) for name in found}
    missing = set()
    for name, requires in found.items():
        for text in requires:
            req = Requirement(text)
            needed = req.marker is None or any(
                req.marker.evaluate({**env, "extra": ""}) for env in LOCKED_FOR
            )
            if needed and canonicalize_name(req.name) not in installed:
                missing.add(f"{name} needs {req}")
    return sorted(missing)


def test_install_is_isolated_locked_and_reused_after_an_integrity_check(
    action: Path, tmp_path: Path
) -> None:
    proc, exe = install(action, tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "installing toolkit" in proc.stdout
    venv = Path(exe).parents[1]
    assert venv.parent == tmp_path / "tool-cache" / "fxcache-toolkit"
    assert re.fullmatch(r"[0-9a-f]{16}", venv.name)
    assert (venv.parent / f"{venv.name}.sha256").is_file()
    version = subprocess.run([exe, "--version"], capture_output=True, text=True, check=True)
    assert version.stdout.strip() == f"fxcache {__version__}"
    # The toolkit's venv never sees the user's torch, and the redis extra only with store redis.
    assert not _imports(exe, "torch") and not _imports(exe, "redis")
    assert _imports(exe, "yaml") and _imports(exe, "jinja2")
    assert _missing_dependencies(exe) == []
    # Its commands run (and may write bytecode) without breaking the recorded hash.
    subprocess.run([exe, "key", "--python", TORCH_PYTHON], capture_output=True, check=True)

    again, exe2 = install(action, tmp_path)
    assert again.returncode == 0 and exe2 == exe, again.stdout + again.stderr
    assert "reusing toolkit" in again.stdout and "unchanged since its install" in again.stdout

    # Tampered: a file of the venv changed after the install -> rebuilt, with a warning.
    site = next(venv.glob("lib/python*/site-packages"))
    cli = site / "ci_fxcache" / "cli.py"
    cli.write_text(cli.read_text() + "\nimport os  # planted\n")
    tampered, exe3 = install(action, tmp_path)
    assert tampered.returncode == 0 and exe3 == exe
    assert "changed since its install (corrupted?); reinstalling" in tampered.stdout
    assert "planted" not in cli.read_text()

    # A new action version (changed sources) gets its own venv.
    init = action / "ci_fxcache" / "__init__.py"
    init.write_text(init.read_text() + "\n# next version\n")
    upgraded, exe4 = install(action, tmp_path)
    assert upgraded.returncode == 0 and exe4 != exe


def test_store_redis_installs_the_redis_extra(action: Path, tmp_path: Path) -> None:
    proc, exe = install(action, tmp_path, FXCACHE_STORE="redis")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert _imports(exe, "redis")
    assert _missing_dependencies(exe) == []  # async-timeout, below Python 3.11.3


def test_store_s3_installs_the_s3_extra(action: Path, tmp_path: Path) -> None:
    proc, exe = install(action, tmp_path, FXCACHE_STORE="s3")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert _imports(exe, "obstore") and _imports(exe, "boto3")
    assert _missing_dependencies(exe) == []


def test_store_object_installs_the_s3_and_gcs_extras(action: Path, tmp_path: Path) -> None:
    proc, exe = install(action, tmp_path, FXCACHE_STORE="object")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert _imports(exe, "obstore") and _imports(exe, "google.auth.identity_pool")
    assert _missing_dependencies(exe) == []


def test_a_wrong_hash_in_the_lock_stops_the_install(action: Path, tmp_path: Path) -> None:
    lock = action / "toolkit" / "requirements.txt"
    text = lock.read_text()
    digest = re.search(r"jinja2==\S+ \\\n\s+--hash=sha256:([0-9a-f]{64})", text)
    assert digest, text
    lock.write_text(text.replace(digest.group(1), "0" * 64))
    proc, exe = install(action, tmp_path)
    assert proc.returncode == 2 and exe == ""
    assert "THESE PACKAGES DO NOT MATCH THE HASHES" in proc.stderr
    assert "::error::fxcache: could not install the toolkit's locked dependencies" in proc.stdout


def test_untrusted_events_never_reuse_a_shared_toolkit(action: Path, tmp_path: Path) -> None:
    trusted, shared = install(action, tmp_path)
    assert trusted.returncode == 0
    event = tmp_path / "event.json"
    event.write_text(json.dumps({"pull_request": {"number": 1}}))
    proc, exe = install(action, tmp_path, GITHUB_ACTIONS="true",
                        GITHUB_EVENT_NAME="pull_request_target",
                        GITHUB_EVENT_PATH=str(event))  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "pull_request_target event: installing a private toolkit" in proc.stdout
    assert Path(exe).parents[1].parent == tmp_path / "runner-temp" and exe != shared


def test_a_preinstalled_toolkit_is_used_as_it_is(action: Path, tmp_path: Path) -> None:
    mine = str(Path(sys.executable).with_name("fxcache"))
    proc, exe = install(action, tmp_path, FXCACHE_TOOLKIT=mine)
    assert proc.returncode == 0 and exe == mine, proc.stdout + proc.stderr
    assert not (tmp_path / "tool-cache").exists()
    init = action / "ci_fxcache" / "__init__.py"
    init.write_text(init.read_text().replace(f'"{__version__}"', '"99.0.0"'))
    old, exe = install(action, tmp_path, FXCACHE_TOOLKIT=mine)
    assert old.returncode == 2 and exe == ""
    assert f"is fxcache {__version__}, this action needs fxcache 99.0.0" in old.stdout


def _digest(venv: Path) -> str:
    """The record the install keeps beside a venv (scripts/install-toolkit.sh `digest`)."""
    import hashlib

    h = hashlib.sha256()
    for top, dirs, files in os.walk(venv):
        dirs.sort()
        for name in sorted(files):
            path = os.path.join(top, name)
            h.update(os.path.relpath(path, venv).encode() + b"\0")
            if os.path.islink(path):
                h.update(b"link:" + os.readlink(path).encode())
            else:
                with open(path, "rb") as fh:
                    h.update(hashlib.sha256(fh.read()).digest())
    return h.hexdigest()


def test_a_venv_rewritten_with_its_record_is_reused(action: Path, tmp_path: Path) -> None:
    """The documented limit (docs/security.md): the record detects corruption, not the job's
    user, who can rewrite the venv and its record alike; such a venv is reused as it is."""
    proc, exe = install(action, tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    venv = Path(exe).parents[1]
    cli = next(venv.glob("lib/python*/site-packages")) / "ci_fxcache" / "cli.py"
    cli.write_text(cli.read_text() + "\n# trojaned\n")
    (venv.parent / f"{venv.name}.sha256").write_text(_digest(venv) + "\n")
    again, exe2 = install(action, tmp_path)
    assert again.returncode == 0 and exe2 == exe
    assert "reusing toolkit" in again.stdout and "trojaned" in cli.read_text()


def test_nothing_on_the_jobs_path_or_in_its_interpreter_runs_the_install(
    action: Path, tmp_path: Path
) -> None:
    """Issue 32: tools planted first on the job's PATH never run (the script takes its tools
    from /usr/bin and /bin), and the base interpreter runs without its site, so a .pth file
    in it never runs either (it would, under -I alone)."""
    marker = tmp_path / "planted-ran"
    bin_dir = tmp_path / "planted-bin"
    bin_dir.mkdir()
    for tool in ("cp", "sed", "od", "find", "xargs", "rm", "cat", "mkdir", "chmod", "flock"):
        fake = bin_dir / tool
        fake.write_text(f"#!/bin/sh\necho {tool} >> {marker}\nexit 1\n")
        fake.chmod(0o755)
    user = tmp_path / "user-venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(user)], check=True)
    site = next(user.glob("lib/python*/site-packages"))
    (site / "zz_planted.pth").write_text(f"import os; open({str(marker)!r}, 'a').write('pth')\n")
    ran = subprocess.run([str(user / "bin/python"), "-I", "-c", "pass"], check=False)
    assert ran.returncode == 0 and marker.exists(), "the .pth does not run under -I: no test"
    marker.unlink()
    path = f"{bin_dir}:{user / 'bin'}:{os.environ['PATH']}"
    proc, exe = install(action, tmp_path, PATH=path, FXCACHE_BASE_PYTHON="python")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert not marker.exists(), marker.read_text()
    version = subprocess.run([exe, "--version"], capture_output=True, text=True, check=True)
    assert version.stdout.strip() == f"fxcache {__version__}"
