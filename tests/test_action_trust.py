"""Issue 25 §2-§5 at the level of the action's steps (`fxcache action <step>` as js/fxcache.js
runs them): trust decided once by setup, secrets only where needed, isolated interpreters, and
the job's cache stats in the post step."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ROOT, TORCH_PYTHON, _clean_env
from tests.fake_cache_service import FakeCacheService
from tests.store_helpers import write_files
from tests.test_action_steps import REPO_ID, Step, pull_request_event, run_step, save_inputs

FORK = pull_request_event(head_name="someone/demo", head_id=REPO_ID + 1, head_fork=True)
KEY = "team-signing-key"
PLANTED = {"inductor/fxgraph/ab/planted/entry": b"planted by the fork " * 50}


def _job(tmp_path: Path, event: dict[str, Any] | None = None, event_name: str = "pull_request",
         **inputs: str) -> tuple[Step, dict[str, Any]]:  # fmt: skip
    """setup + restore of one job; (setup step, restore's state)."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    inputs = {"signing-key": KEY, **inputs}
    setup = run_step(tmp_path, "setup", inputs, event=event, event_name=event_name)
    assert setup.proc.returncode == 0, setup.lines
    settings = setup.outputs["settings"]
    restored = run_step(tmp_path, "restore", inputs, event=event, event_name=event_name,
                        FXCACHE_ACTION_SETTINGS=settings)  # fmt: skip
    assert restored.proc.returncode == 0, restored.lines
    state_path = Path(settings).parent / "restore-state.json"
    return setup, json.loads(state_path.read_text())


def _post(tmp_path: Path, setup: Step, event: dict[str, Any] | None = None,
          event_name: str = "pull_request", **env: str) -> Step:  # fmt: skip
    # The JavaScript hands post-save the runner-held state (and, as on main, a job may still
    # carry FXCACHE_ACTION_SETTINGS in its environment).
    return run_step(tmp_path, "post-save", {"signing-key": KEY}, event=event,
                    event_name=event_name, FXCACHE_ACTION_SETTINGS=setup.outputs["settings"],
                    **setup.post_env(), **env)  # fmt: skip


def _trusted_scope(tmp_path: Path) -> tuple[Path, bytes]:
    """A committed, signed scope in the shared store; (scope dir, its manifest bytes)."""
    setup, state = _job(tmp_path / "trusted", **{"cache-root": str(tmp_path / "store")})
    compiles_into = Path(state["inductor_dir"]).parent  # a keyed job's private overlay
    write_files(compiles_into, {"inductor/fxgraph/cd/mine/entry": b"trusted " * 50})
    post = _post(tmp_path / "trusted", setup)
    assert post.proc.returncode == 0 and '"saved": true' in post.proc.stdout, post.lines
    scope = Path(state["scope_dir"])
    return scope, (scope / "manifest.json").read_bytes()


def test_a_fork_cannot_talk_the_end_of_job_save_into_writing(tmp_path: Path) -> None:
    """A fork's job flips `read_only` in the restore state (and in the settings file) and
    plants files into the shared scope; the post step commits none of it."""
    root = tmp_path / "store"
    scope, manifest = _trusted_scope(tmp_path)
    fork_dir = tmp_path / "fork"
    setup, state = _job(fork_dir, event=FORK, **{"cache-root": str(root)})
    assert state["read_only"] is True and state["overlay_dir"]
    state_path = Path(setup.outputs["settings"]).parent / "restore-state.json"
    forged = {**state, "read_only": False, "overlay_dir": None, "lease": None, "mac": None}
    state_path.write_text(json.dumps(forged))
    write_files(scope, PLANTED)
    post = _post(fork_dir, setup, event=FORK)
    assert post.proc.returncode == 0, post.lines
    assert '"saved": false' in post.proc.stdout and "read-only run" in post.proc.stdout
    assert (scope / "manifest.json").read_bytes() == manifest
    # The settings file rewritten as well: the post step refuses settings setup did not write.
    settings = Path(setup.outputs["settings"])
    settings.write_text(settings.read_text().replace('"read_only": true', '"read_only": false'))
    again = _post(fork_dir, setup, event=FORK)
    assert again.proc.returncode == 2 and len(again.errors) == 1, again.lines
    assert "changed after setup wrote them" in again.errors[0]
    assert (scope / "manifest.json").read_bytes() == manifest


def test_the_save_sub_action_rechecks_the_event(tmp_path: Path) -> None:
    """The save sub-action has no runner-held link to setup: a settings file forged to say
    `read_only: false` in a pull_request_target run still saves nothing."""
    scope, manifest = _trusted_scope(tmp_path)
    job = tmp_path / "target"
    setup, _ = _job(job, event=pull_request_event(), event_name="pull_request_target",
                    **{"cache-root": str(tmp_path / "store")})  # fmt: skip
    settings = Path(setup.outputs["settings"])
    data = json.loads(settings.read_text())
    settings.write_text(json.dumps({**data, "read_only": False, "untrusted": None}))
    write_files(scope, PLANTED)
    saved = run_step(job, "save", event=pull_request_event(), event_name="pull_request_target",
                     FXCACHE_INPUTS=save_inputs(pull_request_event(), "pull_request_target", KEY),
                     FXCACHE_ACTION_SETTINGS=str(settings))  # fmt: skip
    assert saved.proc.returncode == 0, saved.lines
    assert saved.outputs["saved"] == "false" and "pull_request_target event" in saved.proc.stdout
    assert (scope / "manifest.json").read_bytes() == manifest


def test_a_state_file_this_job_did_not_write_is_refused(tmp_path: Path) -> None:
    root = str(tmp_path / "store")
    one, _ = _job(tmp_path / "one", **{"cache-root": root})
    two, _ = _job(tmp_path / "two", **{"cache-root": root})
    mine = Path(one.outputs["settings"]).parent / "restore-state.json"
    other = Path(two.outputs["settings"]).parent / "restore-state.json"
    mine.write_bytes(other.read_bytes())  # another job's (validly signed) state
    post = _post(tmp_path / "one", one)
    assert post.proc.returncode == 2 and len(post.errors) == 1, post.lines
    assert "was not written by this job's restore" in post.errors[0]


def test_store_github_read_only_runs_never_unpack_into_the_shared_root(tmp_path: Path) -> None:
    """A fork's run downloads its own pull request's entry (one it could fill itself) into a
    private root: the runner's store never gets it, so no later trusted restore serves it."""
    root = tmp_path / "store"
    with FakeCacheService() as fake:
        inputs = {"store": "github", "cache-root": str(root), "save": "always"}
        setup, state = _job(tmp_path / "a", **inputs)
        write_files(Path(state["inductor_dir"]).parent, PLANTED)  # where the keyed job compiles
        assert _post(tmp_path / "a", setup, **fake.env()).proc.returncode == 0
        assert len(fake.committed()) == 1
        import shutil

        shutil.rmtree(root)  # a fresh runner
        fork = tmp_path / "fork"
        fork.mkdir()
        setup = run_step(fork, "setup", inputs, event=FORK)
        settings = setup.outputs["settings"]
        restored = run_step(fork, "restore", inputs, event=FORK, FXCACHE_ACTION_SETTINGS=settings,
                            **fake.env())  # fmt: skip
        assert restored.proc.returncode == 0, restored.lines
        assert restored.outputs["cache-hit"] == "true", restored.lines
        assert not root.exists() or not any(root.iterdir()), sorted(root.rglob("*"))


WORKLOAD = """
import json, os, sys
def factory(**options):
    with open(os.environ["ENV_DUMP"], "w") as fh:
        json.dump(dict(os.environ), fh)
    raise RuntimeError("this workload only prints its environment")
"""


def test_the_workloads_see_no_secret(tmp_path: Path) -> None:
    """A workload module (a fork's code) runs in the worker: it sees neither FXCACHE_INPUTS
    nor any secret, even when its step was handed them all."""
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "envdump.py").write_text(WORKLOAD)
    dump = tmp_path / "worker-env.json"
    token, url = "ghs_the_token_value", "redis://:hunter2@cache.internal:6379/0"
    inputs = {"workloads": "envdump:factory", "device": "cpu", "dtypes": "float32",
              "dynamic": "false", "mechanisms": "fxgraph", "training": "false",
              "github-token": token, "signing-key": KEY, "redis-url": url}  # fmt: skip
    env = {"PYTHONPATH": str(pkg), "ENV_DUMP": str(dump)}
    setup = run_step(tmp_path, "setup", inputs, **env)
    assert setup.proc.returncode == 0, setup.lines
    settings = setup.outputs["settings"]
    verify = run_step(tmp_path, "verify", inputs, FXCACHE_ACTION_SETTINGS=settings, **env)
    assert dump.is_file(), verify.lines
    seen = dump.read_text()
    for secret in (token, KEY, "hunter2", "FXCACHE_INPUTS"):
        assert secret not in seen, secret


def test_every_line_of_a_multi_line_secret_is_masked(tmp_path: Path) -> None:
    key = "-----BEGIN KEY-----\nc2VjcmV0IGxpbmU=\n-----END KEY-----"
    s = run_step(tmp_path, "setup", {"signing-key": key})
    masks = [line for line in s.lines if line.startswith("::add-mask::")]
    expected = [f"::add-mask::{line}" for line in key.splitlines()]
    assert [m for m in masks if m in expected] == expected, s.lines
    assert not any(line == "c2VjcmV0IGxpbmU=" for line in s.lines), "a line printed in clear"


def test_a_mask_is_escaped_as_the_runner_reads_it(tmp_path: Path) -> None:
    """Issue 32: the runner unescapes `%25`, `%0D` and `%0A` in a command's data, so a key
    holding `%25` or a lone CR is masked exactly only when escaped."""
    from tests.runner_sim import unescape

    key = "k%25ey with 100% and\ra CR\nsecond line"
    s = run_step(tmp_path, "setup", {"signing-key": key})
    masks = {unescape(line[len("::add-mask::") :]) for line in s.lines
             if line.startswith("::add-mask::")}  # fmt: skip
    assert {"k%25ey with 100% and", "a CR", "second line"} <= masks or {
        "k%25ey with 100% and\ra CR", "second line"} <= masks, s.lines  # fmt: skip


PLANT = 'open({marker!r}, "a").write("ran\\n")\nraise ImportError("planted")\n'


def test_nothing_from_the_working_directory_runs_inside_fxcache(tmp_path: Path) -> None:
    """A planted json.py in the job's working directory: neither the fingerprint snippet (the
    user's interpreter) nor the spare-overlay process (the toolkit's) imports it."""
    work = tmp_path / "work"
    work.mkdir()
    marker = tmp_path / "planted-ran"
    (work / "json.py").write_text(PLANT.format(marker=str(marker)))
    root = tmp_path / "store"
    fxcache = [sys.executable, "-m", "ci_fxcache"]

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        # ci_fxcache itself comes from the installed toolkit (its own directory, not cwd).
        return subprocess.run([*fxcache, *args], cwd=work, env=_clean_env({}), text=True,
                              capture_output=True, check=False, timeout=300)  # fmt: skip

    state = tmp_path / "state.json"
    common = ["--root", str(root), "--python", TORCH_PYTHON, "--state-file", str(state)]
    # `python -m ci_fxcache` itself puts cwd first: import the toolkit from a clean directory
    # for the toolkit's own process, as the installed `fxcache` (python -I) does.
    fxcache[:] = [sys.executable, "-I", "-m", "ci_fxcache"]
    first = run("restore", "--json", *common)
    assert first.returncode == 0, first.stderr
    write_files(json.loads(first.stdout)["scope_dir"], PLANTED)
    assert run("save", "--state-file", str(state)).returncode == 0
    second = run("restore", "--json", "--read-only", *common)  # builds a spare in background
    assert second.returncode == 0, second.stderr
    deadline = time.monotonic() + 120  # the spare is built by a detached process
    while time.monotonic() < deadline and not any((root / ".spares").glob("*")):
        time.sleep(0.2)
    assert any((root / ".spares").glob("*")), "no spare was built"
    assert not marker.exists(), "a planted json.py ran inside fxcache"


def _compile(cache_dir: str, out: Path) -> dict[str, Any]:
    env = _clean_env({"TORCHINDUCTOR_CACHE_DIR": cache_dir, "TORCHINDUCTOR_COMPILE_THREADS": "1"})
    proc = subprocess.run([TORCH_PYTHON, str(ROOT / "tests/act/user_compile.py"), str(out)],
                          env=env, capture_output=True, text=True, check=False)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    return dict(json.loads(out.read_text()))


@pytest.mark.slow
def test_job_cache_stats_show_what_the_job_compiled(tmp_path: Path) -> None:
    """A job that compiles a new function: the post step's summary, outputs and JSON show
    new FX-graph entries; the same job again: "compiled nothing new"."""
    root = str(tmp_path / "store")
    stats = []
    for run in ("first", "second"):
        job = tmp_path / run
        setup, state = _job(job, **{"cache-root": root})
        _compile(state["inductor_dir"], job / "user.json")
        summary = job / "summary.md"
        post = _post(job, setup, GITHUB_STEP_SUMMARY=str(summary))
        assert post.proc.returncode == 0, post.lines
        doc = json.loads(Path(post.outputs["stats-json"]).read_text())
        stats.append((doc, summary.read_text(), post.outputs))
    (first, first_md, first_out), (second, second_md, second_out) = stats
    assert first["saved"] and first["new"]["fxgraph"]["entries"] >= 1, first
    assert first["new"]["fxgraph"]["bytes"] > 0 and first["scope_bytes"] > 0, first
    assert first["restore_s"] is not None and first["save_s"] is not None, first
    assert "| FX graph |" in first_md and "compiled nothing new" not in first_md, first_md
    assert int(first_out["new-entries"]) >= 1
    assert second["saved"] and all(v["entries"] == 0 for v in second["new"].values()), second
    # one line of cache stats, then the job's own compiles (docs/job-stats.md)
    cache_lines = [line for line in second_md.splitlines() if "job cache stats" in line]
    assert cache_lines == [second_md.splitlines()[0]], second_md
    assert "compiled nothing new" in cache_lines[0]
    assert second_md.splitlines()[1].startswith("**your job"), second_md
    assert second_out["new-entries"] == "0" and second["scope_bytes"] == first["scope_bytes"]


def test_job_stats_count_entries_by_kind() -> None:
    from ci_fxcache.action import job_stats

    before = {"inductor/fxgraph/aa/k1/e": 10}
    after = {
        **before,
        "inductor/fxgraph/bb/k2/e": 20,
        "inductor/aotautograd/k3/e": 30,
        "triton/KERNEL1/a.cubin": 40,
        "triton/KERNEL1/a.json": 5,
        "verify/references/x": 99,
    }
    from ci_fxcache.store import tiered
    from ci_fxcache.store.tiered import mf

    manifest = {"files": {rel: {"size": size} for rel, size in after.items()}}
    saved = tiered.Saved(
        {"saved": True}, mf.Committed.of(manifest), tuple(set(after) - set(before))
    )
    stats = job_stats.compute(saved, {"restore_s": 1.5})
    assert stats["new"] == {
        "fxgraph": {"entries": 1, "bytes": 20},
        "aotautograd": {"entries": 1, "bytes": 30},
        "triton": {"entries": 1, "bytes": 45},
    }
    assert stats["scope_bytes"] == sum(after.values()) and stats["save_s"] is None
    assert "| Triton | 1 | 45 B |" in job_stats.render(stats)


def test_spare_and_snippet_get_no_secret(monkeypatch: pytest.MonkeyPatch) -> None:
    from ci_fxcache import names

    monkeypatch.setenv(names.SIGNING_ENV, KEY)
    monkeypatch.setenv("FXCACHE_INPUTS", "{}")
    env = names.without_secrets()
    assert names.SIGNING_ENV not in env and "FXCACHE_INPUTS" not in env
    assert env.get("PATH") == os.environ.get("PATH")


# -- issue 32: no secret to a program we did not pick -----------------------------------------

PTH = (
    "import json, os; open(os.environ['PTH_DUMP'], 'a').write(json.dumps(dict(os.environ)) + "
    "'\\n') if os.environ.get('PTH_DUMP') else None\n{site}\n"
)
FAKE_NVIDIA_SMI = "#!/bin/sh\nenv -0 > {dump}\nexit 1\n"


def _user_python(tmp_path: Path) -> str:
    """The user's interpreter: a venv whose site-packages holds a .pth that appends its
    environment to $PTH_DUMP whenever the interpreter starts (site runs it, even under -I),
    and reaches torch through this venv's site-packages."""
    import sysconfig

    venv = tmp_path / "user-venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    site = next(venv.glob("lib/python*/site-packages"))
    (site / "zz_envdump.pth").write_text(PTH.format(site=sysconfig.get_paths()["purelib"]))
    return str(venv / "bin" / "python")


def test_the_users_interpreter_and_gpu_tools_get_no_secret(tmp_path: Path) -> None:
    """restore runs the user's interpreter (the fingerprint snippet) and nvidia-smi (found on
    PATH) with the signing key and the store credentials in its own environment, verify runs
    the worker: none of them gets a secret, a runner token or a file command."""
    python = _user_python(tmp_path)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    smi = bin_dir / "nvidia-smi"
    smi.write_text(FAKE_NVIDIA_SMI.format(dump=tmp_path / "nvidia-smi-env"))
    smi.chmod(0o755)
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "envdump.py").write_text(WORKLOAD)
    dumps = tmp_path / "pth-dumps.jsonl"
    secrets = {
        "AWS_ACCESS_KEY_ID": "AKIAUSERPYTHON",
        "AWS_SECRET_ACCESS_KEY": "aws-secret-for-the-store",
        "AWS_SESSION_TOKEN": "aws-session-token",
        "ACTIONS_RUNTIME_TOKEN": "actions-runtime-token",
        "ACTIONS_ID_TOKEN_REQUEST_TOKEN": "oidc-request-token",
        "GITHUB_TOKEN": "ghs_job_token_in_env",
    }
    env = {"PATH": f"{bin_dir}:{os.environ['PATH']}", "PTH_DUMP": str(dumps),
           "PYTHONPATH": str(pkg), "ENV_DUMP": str(tmp_path / "w.json"), **secrets}  # fmt: skip
    inputs = {"python": python, "signing-key": KEY, "workloads": "envdump:factory",
              "device": "cpu", "dtypes": "float32", "dynamic": "false",
              "mechanisms": "fxgraph", "training": "false"}  # fmt: skip
    setup = run_step(tmp_path, "setup", inputs, **env)
    assert setup.proc.returncode == 0, setup.lines
    settings = setup.outputs["settings"]
    for step in ("restore", "verify"):
        run_step(tmp_path, step, inputs, FXCACHE_ACTION_SETTINGS=settings, **env)
    seen = [json.loads(line) for line in dumps.read_text().splitlines()]
    assert len(seen) >= 2, "the user's interpreter did not run for the snippet and the worker"
    smi_env = (tmp_path / "nvidia-smi-env").read_bytes().decode().split("\0")
    seen.append(dict(pair.split("=", 1) for pair in smi_env if "=" in pair))
    for environ in seen:
        for name, value in secrets.items():
            assert name not in environ and value not in environ.values(), name
        assert KEY not in json.dumps(environ)
        leaked = {"FXCACHE_INPUTS", "FXCACHE_SIGNING_KEY", "GITHUB_ENV", "GITHUB_OUTPUT",
                  "GITHUB_PATH", "GITHUB_STATE"} & set(environ)  # fmt: skip
        assert leaked == set(), leaked


# -- issue 32: signing means what it says (the GitHub tier) -----------------------------------


def _entry_manifest(fake: FakeCacheService, key: str, where: Path) -> dict[str, Any]:
    from ci_fxcache.store.remote.github import archive

    (entry,) = [e for e in fake.committed() if e.key == key]
    where.mkdir()
    scope = where / "scope"
    archive.extract(io.BytesIO(fake.blob_bytes(entry)).read, scope)  # the tier's own reader
    return dict(json.loads((scope / "manifest.json").read_text()))


def test_a_keyless_writers_github_entry_is_never_signed_by_a_keyed_save(tmp_path: Path) -> None:
    """A job without the key uploads an entry holding its files; a keyed job on a fresh
    runner refuses it (cold), and its own entry is signed and names none of those files."""
    from ci_fxcache.store import manifest as mf

    planted = {"inductor/fxgraph/ab/planted/entry": b"pickled by a keyless writer " * 20}
    mine = {"inductor/fxgraph/cd/mine/entry": b"compiled by the keyed job " * 20}
    with FakeCacheService() as fake:
        inputs = {"store": "github", "save": "always"}
        keyless_dir = tmp_path / "keyless"
        setup, state = _job(keyless_dir, **inputs, **{"signing-key": "",
                            "cache-root": str(keyless_dir / "store")})  # fmt: skip
        write_files(Path(state["inductor_dir"]).parent, planted)
        post = run_step(keyless_dir, "post-save", {**inputs, "signing-key": ""},
                        **setup.post_env(), **fake.env())  # fmt: skip
        assert post.proc.returncode == 0 and len(fake.committed()) == 1, post.lines

        keyed_dir = tmp_path / "keyed"
        keyed_dir.mkdir()
        setup = run_step(keyed_dir, "setup", {**inputs, "signing-key": KEY},
                         GITHUB_RUN_ID="4243")  # a later run: its own entry key  # fmt: skip
        settings = setup.outputs["settings"]
        restored = run_step(keyed_dir, "restore", {**inputs, "signing-key": KEY},
                            FXCACHE_ACTION_SETTINGS=settings, GITHUB_RUN_ID="4243",
                            **fake.env())  # fmt: skip
        assert restored.outputs["cache-hit"] == "false", restored.lines
        assert any("not signed" in line for line in restored.lines), restored.lines
        state = json.loads((Path(settings).parent / "restore-state.json").read_text())
        write_files(Path(state["inductor_dir"]).parent, mine)
        post = run_step(keyed_dir, "post-save", {**inputs, "signing-key": KEY},
                        GITHUB_RUN_ID="4243", **setup.post_env(), **fake.env())  # fmt: skip
        assert post.proc.returncode == 0, post.lines
        assert len(fake.committed()) == 2, post.lines
        gha_key = f"{restored.outputs['cache-key']}-run4243.2"  # this run's own entry
        manifest = _entry_manifest(fake, gha_key, tmp_path / "entry")
        assert mf.signature_problem(manifest, KEY) is None
        assert set(manifest["files"]) == set(mine)
        assert fake.violations == []


def test_a_keyed_job_never_uploads_a_manifest_rewritten_after_its_save(tmp_path: Path) -> None:
    """The save sub-action commits with the key but cannot upload (its step had no cache
    service: one warning); a process without the key then replaces the manifest with an
    unsigned one naming a planted file. The end-of-job save uploads nothing: the job saved
    once, and an upload only ever sends the manifest its own save committed (issue 39: never
    a re-read of the disk)."""
    with FakeCacheService() as fake:
        inputs = {"store": "github", "save": "always", "cache-root": str(tmp_path / "store")}
        setup, state = _job(tmp_path, **inputs)
        settings = setup.outputs["settings"]
        write_files(Path(state["inductor_dir"]).parent, PLANTED)
        saved = run_step(tmp_path, "save", FXCACHE_INPUTS=save_inputs(signing_key=KEY),
                         FXCACHE_ACTION_SETTINGS=settings)  # no cache service here  # fmt: skip
        assert saved.outputs["saved"] == "true" and fake.committed() == [], saved.lines
        warned = [line for line in saved.lines if line.startswith("::warning::")]
        assert any("kept locally" in w and "JavaScript" in w for w in warned), saved.lines
        scope = Path(state["scope_dir"])
        manifest = json.loads((scope / "manifest.json").read_text())
        evil = b"import os  # planted after the keyed save"
        (scope / "inductor/evil.py").write_bytes(evil)
        import hashlib

        st = (scope / "inductor/evil.py").stat()
        manifest["files"]["inductor/evil.py"] = {
            "size": len(evil), "mtime_ns": st.st_mtime_ns,
            "sha256": hashlib.sha256(evil).hexdigest()}  # fmt: skip
        manifest["total_bytes"] += len(evil)
        del manifest["signature"]
        (scope / "manifest.json").chmod(0o644)
        (scope / "manifest.json").write_text(json.dumps(manifest))
        post = _post(tmp_path, setup, **fake.env())
        assert post.proc.returncode == 0, post.lines
        assert fake.committed() == [], "an unsigned manifest went up under the keyed job's key"
        assert "already saved in this job (saved: true)" in post.proc.stdout, post.lines


def test_the_save_sub_action_ignores_a_planted_event_file(tmp_path: Path) -> None:
    """A fork's pull request (the runner's record says so) rewrites $GITHUB_EVENT_PATH to
    look like the repository's own and setup's settings to say `read_only: false`: the save
    sub-action decides from the runner's record and commits nothing."""
    from tests.runner_sim import run_event

    scope, manifest = _trusted_scope(tmp_path)
    job = tmp_path / "fork"
    record = run_event("pull_request", FORK)
    setup, _ = _job(job, event=FORK, **{"cache-root": str(tmp_path / "store"), "signing-key": ""})
    settings = Path(setup.outputs["settings"])
    data = json.loads(settings.read_text())
    settings.write_text(json.dumps({**data, "read_only": False, "untrusted": None}))
    state_path = settings.parent / "restore-state.json"
    state = json.loads(state_path.read_text())
    state_path.write_text(json.dumps({**state, "read_only": False, "overlay_dir": None,
                                      "lease": None}))  # fmt: skip
    write_files(scope, PLANTED)
    inputs = json.dumps({"python": "", "signing-key": "", "toolkit": "", "run-event": record})
    saved = run_step(job, "save", event=pull_request_event(),  # the planted file: same repo
                     FXCACHE_INPUTS=inputs, FXCACHE_ACTION_SETTINGS=str(settings))  # fmt: skip
    assert saved.proc.returncode == 0, saved.lines
    assert saved.outputs["saved"] == "false", saved.lines
    assert "pull request from fork someone/demo" in saved.proc.stdout
    assert (scope / "manifest.json").read_bytes() == manifest
