"""The torch-version gates: each mechanism and option on the release that has it."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import tomllib
from pathlib import Path
from typing import Any

import pytest

from ci_fxcache import mechanisms
from ci_fxcache.env import torch_support
from ci_fxcache.report import known_issues
from ci_fxcache.verify import matrix, runner
from ci_fxcache.verify.forkserver import worker_env
from tests.conftest import ROOT, TORCH2_VERSION, TORCH_PYTHON, RunFxcache, torch2_python


@pytest.mark.parametrize(
    ("version", "mechanism", "dynamic", "reason"),
    [
        ("2.13.0+cpu", "fxgraph", "false", None),
        ("2.13.0+cpu", "precompile", "mark", None),
        ("2.14.1+cu130", "remote", "true", None),
        ("2.6.0", "fxgraph", "true", None),
        ("2.6.0+cu124", "remote", "false", None),
        (
            "2.6.0",
            "mega",
            "false",
            "mega needs torch >= 2.7 (torch.compiler.save_cache_artifacts / "
            "load_cache_artifacts (mega-cache)); this is torch 2.6.0",
        ),
        ("2.7.1", "mega", "false", None),
        (
            "2.8.0",
            "precompile",
            "false",
            "precompile needs torch >= 2.10 (torch.compiler.save_cache_artifacts() carrying "
            "caching-precompile entries); this is torch 2.8.0",
        ),
        (
            "2.9.1+cu128",
            "precompile",
            "true",
            "precompile needs torch >= 2.10 (torch.compiler.save_cache_artifacts() carrying "
            "caching-precompile entries); this is torch 2.9.1+cu128",
        ),
        ("2.10.0a0+git1234abc", "precompile", "false", None),
        (
            "2.8.0",
            "aot",
            "false",
            "aot needs torch >= 2.9 (torch.compile(...).aot_compile() + save_compiled_function "
            "/ torch.compiler.load_compiled_function); this is torch 2.8.0",
        ),
        ("2.9.0+cu128", "aot", "true", None),
        (
            "2.14.1+cu130",
            "precompile-api",
            "false",
            "precompile-api needs torch >= 2.15 (torch.compiler.precompile.capture / load; "
            "torch 2.14's callable torch.compiler.precompile(fn, *inputs) is not supported); "
            "this is torch 2.14.1+cu130",
        ),
        ("2.15.0+cu132", "precompile-api", "mark", None),
        ("2.16.0", "precompile-api", "true", None),
        ("2.5.1", "fxgraph", "false", "fxcache supports torch >= 2.6; this is torch 2.5.1"),
        ("1.13.1", "remote", "mark", "fxcache supports torch >= 2.6; this is torch 1.13.1"),
        ("", "precompile", "false", None),
        ("unknown", "mega", "false", None),
    ],
)
def test_gate_on_version_strings(
    version: str, mechanism: str, dynamic: str, reason: str | None
) -> None:
    assert torch_support.too_old(version, mechanism, dynamic) == reason


def test_a_gated_combination_is_skipped_with_cause_torch_too_old() -> None:
    combo = {"mechanism": "precompile", "dynamic": "true"}
    assert torch_support.skip("2.13.0", combo) is None
    assert torch_support.skip("2.9.1", combo) == {
        "cause": "torch-too-old",
        "reason": torch_support.too_old("2.9.1", "precompile", "true"),
    }


@pytest.mark.parametrize(
    ("version", "release"),
    [
        ("2.13.0+cpu", (2, 13, 0)),
        ("2.10.0a0+git1234", (2, 10, 0)),
        ("2.9.0.dev20250801", (2, 9, 0)),
        ("2.6", (2, 6)),
        ("", ()),
        ("cpu", ()),
    ],
)
def test_release(version: str, release: tuple[int, ...]) -> None:
    assert torch_support.release(version) == release


def test_every_mechanism_and_option_has_a_gate() -> None:
    named = {n for m in mechanisms.ALL for n in m.needs}
    named |= {n for needs in torch_support.DYNAMIC_NEEDS.values() for n in needs}
    assert named | set(torch_support.OPTIONAL) == set(torch_support.OPTIONS)
    for option in torch_support.OPTIONS.values():
        assert option.probe[0].startswith("torch") and option.probe[1], option
        assert option.since <= torch_support.release(torch_support.NEWEST_TESTED)[:2]


class _NoServer:
    """Stands in for the fork server of an older torch: the gates must skip every combination
    before anything would run there."""

    def __init__(self, torch: str = "2.6.0+cu124") -> None:
        self.info = {"torch": torch, "cuda_capabilities": [], "hip": False}

    def run(self, *args: Any, **kwargs: Any) -> Any:
        raise AssertionError(f"a gated combination ran: {args}")


def test_the_matrix_on_an_older_torch_skips_instead_of_running(tmp_path: Path) -> None:
    plan = matrix.Matrix(devices=["cpu"], mechanisms=["mega", "precompile"])
    settings = runner.Settings(cache_dir=tmp_path, run_dir=tmp_path / "run")
    combos, _ = runner.run(_NoServer(), plan, settings, lambda _: None)  # type: ignore[arg-type]
    assert len(combos) == 8
    for combo in combos:
        assert combo["verdict"] == "skipped" and combo["cause"] == "torch-too-old"
        needs = "2.7" if combo["mechanism"] == "mega" else "2.10"
        assert combo["reason"].startswith(f"{combo['mechanism']} needs torch >= {needs} (")
        assert combo["reason"].endswith("; this is torch 2.6.0+cu124")


@pytest.mark.parametrize(
    ("torch", "mechanism", "needs"),
    [("2.8.0", "aot", "aot needs torch >= 2.9 ("), ("2.14.1+cu130", "precompile-api", None)],
)
def test_each_artifact_mechanism_is_skipped_before_the_torch_that_has_it(
    tmp_path: Path, torch: str, mechanism: str, needs: str | None
) -> None:
    """torch 2.14's callable `torch.compiler.precompile(fn, *inputs)` is named as unsupported,
    not attempted: nothing runs (the stand-in server refuses any phase)."""
    plan = matrix.Matrix(devices=["cpu"], mechanisms=[mechanism], training=[True, False])
    settings = runner.Settings(cache_dir=tmp_path, run_dir=tmp_path / "run")
    combos, _ = runner.run(_NoServer(torch), plan, settings, lambda _: None)  # type: ignore[arg-type]
    assert len(combos) == 8
    for combo in combos:
        assert (combo["verdict"], combo["cause"]) == ("skipped", "torch-too-old")
        assert combo["reason"].startswith(needs or "precompile-api needs torch >= 2.15 (")
        assert combo["reason"].endswith(f"; this is torch {torch}")
    if mechanism == "precompile-api":
        assert (
            "torch 2.14's callable torch.compiler.precompile(fn, *inputs) is not supported"
            in (combos[0]["reason"])
        )


@pytest.mark.slow
def test_the_table_matches_each_real_torch(torch_python: str) -> None:
    """Every option the table says a release has is there, probed by importing real torch."""
    version, present = torch_support.probe(torch_python)
    assert version.startswith(("2.13.0", TORCH2_VERSION))
    assert present == torch_support.expected(version)
    # every mechanism runs on both real versions, but torch 2.15's precompile module
    gated = [m for m in mechanisms.names() if torch_support.too_old(version, m, "mark")]
    assert gated == ([] if version.startswith(TORCH2_VERSION) else ["precompile-api"])


@pytest.mark.slow
def test_worker_without_a_required_option_fails_with_a_clear_error(tmp_path: Path) -> None:
    """On real torch 2.15.0 with caching_precompile removed (as on torch < 2.9), a precompile
    phase ends with a one-line error naming the option: no traceback as the result, no crash."""
    script = (
        "import json, sys, torch, torch._dynamo.config as c\n"
        "delattr(c, 'caching_precompile')\n"
        "from _fxcache_worker import phase\n"
        "print(json.dumps(phase.run(json.loads(sys.argv[1]))))\n"
    )
    spec = {**_spec(tmp_path, "precompile"), "artifacts": [str(tmp_path / "mega.bin")]}
    result = _worker(script, spec)
    assert result["status"] == "error"
    assert result["error"] == (
        "MissingOption: this torch has no torch._dynamo.config.caching_precompile"
    )
    assert not (tmp_path / "reference.pt").exists()  # it stopped before compiling anything


@pytest.mark.slow
def test_the_2_14_callable_precompile_is_named_unsupported_by_the_worker(tmp_path: Path) -> None:
    """A torch whose `torch.compiler.precompile` is torch 2.14's callable (the real 2.15.0 with
    its module replaced by a function, as a vendor build might ship it under a 2.15 version):
    the precompile-api phase stops with one line naming the unsupported form, compiling
    nothing."""
    script = (
        "import json, sys, torch\n"
        "def precompile(fn, *example_inputs):\n"
        "    raise AssertionError('the callable form was called')\n"
        "torch.compiler.precompile = precompile\n"
        "from _fxcache_worker import phase\n"
        "print(json.dumps(phase.run(json.loads(sys.argv[1]))))\n"
    )
    spec = _spec(tmp_path, "precompile-api")
    result = _worker(script, spec)
    assert result["status"] == "error"
    assert result["error"] == (
        "MissingOption: this torch's torch.compiler.precompile is the torch 2.14 callable "
        "(precompile(fn, *inputs)), which fxcache does not support; precompile-api needs torch "
        "2.15's module (torch.compiler.precompile.capture / load)"
    )
    assert not (tmp_path / "reference.pt").exists()


def _spec(tmp_path: Path, mechanism: str) -> dict[str, Any]:
    """A cold phase's spec for `mechanism` (sin_matmul, float32, static, inference)."""
    return {
        "phase": "cold",
        "combo": {
            "workload": "sin_matmul",
            "device": "cpu",
            "dtype": "float32",
            "dynamic": "false",
            "mechanism": mechanism,
            "training": False,
        },
        "dir": str(tmp_path),
        "inductor_dir": str(tmp_path / "inductor"),
        "triton_dir": str(tmp_path / "triton"),
        "eager": True,
        "redis_url": None,
        "cache_tag": "",
        "artifacts": [],
    }


def _worker(script: str, spec: dict[str, Any]) -> dict[str, Any]:
    """Run `script` (which prints `phase.run(spec)`) in the second real torch's interpreter."""
    env, private = worker_env()
    try:
        proc = subprocess.run(
            [torch2_python(), "-c", script, json.dumps(spec)],
            capture_output=True,
            text=True,
            env=env,
            timeout=300,
            check=False,
        )
    finally:
        shutil.rmtree(private, ignore_errors=True)
    assert proc.returncode == 0, proc.stderr
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["torch_version"].startswith(TORCH2_VERSION)
    return result


# A stand-in torch that the fork server can import (it compiles nothing): enough for a matrix
# whose every combination is skipped before a phase would run.
_STANDIN = {
    "__init__.py": "__version__ = {version!r}\nfrom . import cuda, version\n",
    "version.py": "__version__ = {version!r}\ngit_version = 'standin'\ncuda = None\nhip = None\n",
    "cuda/__init__.py": "def is_available():\n    return False\n",
    "_dynamo/__init__.py": "",
    "_functorch/__init__.py": "",
    "_functorch/aot_autograd.py": "",
    "_inductor/__init__.py": "",
    "_inductor/codecache.py": "",
    "_inductor/compile_fx.py": "",
    "_inductor/config.py": "",
}


def _standin_torch(base: Path, version: str) -> dict[str, str]:
    for name, text in _STANDIN.items():
        path = base / "torch" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text.format(version=version))
    return {"PYTHONPATH": str(base)}


def _notices(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if "notice" in line]


def test_a_newer_torch_gets_one_notice_line_never_a_failure(
    run_fxcache: RunFxcache, tmp_path: Path
) -> None:
    """fingerprint, restore and verify each say it once; the report's context shows it."""
    env = _standin_torch(tmp_path / "site", "2.16.0+cu140")
    said = (
        "fxcache: notice: torch 2.16.0+cu140 is newer than the newest fxcache was tested with "
        "(2.15.0); it runs, and each torch option it uses is checked where it is used"
    )
    fingerprint = run_fxcache("fingerprint", "--json", "--python", TORCH_PYTHON, env=env)
    assert fingerprint.returncode == 0, fingerprint.stderr
    assert _notices(fingerprint.stderr) == [said]
    json.loads(fingerprint.stdout)  # stdout stays a clean document
    restore = run_fxcache(
        "restore", "--python", TORCH_PYTHON, "--root", str(tmp_path / "store"), env=env
    )
    assert restore.returncode == 0, restore.stderr
    assert _notices(restore.stderr) == [said]
    out = tmp_path / "results.json"
    args = ("verify", "--python", TORCH_PYTHON, "--device", "cuda", "--json", str(out))
    verify = run_fxcache(*args, "--cache-dir", str(tmp_path / "v"), env=env, timeout=300)
    assert verify.returncode == 0, verify.stderr
    assert _notices(verify.stderr) == [said]
    doc = json.loads(out.read_text())
    assert {(c["verdict"], c["cause"]) for c in doc["combos"]} == {("skipped", "no-device")}
    report = run_fxcache("report", str(out), "--format", "md")
    assert report.returncode == 0, report.stderr
    assert "| torch | 2.16.0+cu140 (newer than tested: 2.15.0) |" in report.stdout
    # inside Actions: one notice annotation
    actions = run_fxcache(
        "fingerprint", "--python", TORCH_PYTHON, env={**env, "GITHUB_ACTIONS": "true"}
    )
    assert _notices(actions.stderr) == ["::notice::" + said.replace("notice: ", "", 1)]


@pytest.mark.parametrize("version", ["2.15.0+cu132", "2.13.0+cpu", "2.5.1"])
def test_no_notice_for_a_tested_or_older_torch(
    run_fxcache: RunFxcache, tmp_path: Path, version: str
) -> None:
    """The newest tested and older releases say nothing; one below the minimum keeps its clear
    reason on every combination (nothing runs)."""
    env = _standin_torch(tmp_path / "site", version)
    out = tmp_path / "results.json"
    device = "cpu" if version == "2.5.1" else "cuda"  # either way no phase runs
    args = ("verify", "--python", TORCH_PYTHON, "--device", device, "--json", str(out))
    proc = run_fxcache(*args, "--cache-dir", str(tmp_path / "v"), env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert _notices(proc.stderr) == []
    combos = json.loads(out.read_text())["combos"]
    if version == "2.5.1":
        assert {c["reason"] for c in combos} == {
            "fxcache supports torch >= 2.6; this is torch 2.5.1"
        }


@pytest.mark.slow
def test_worker_without_an_optional_option_notes_it_and_still_judges(
    run_fxcache: RunFxcache, tmp_path: Path
) -> None:
    """On real torch 2.15.0 with torch.compiler.set_stance removed (as on torch < 2.6), the hot
    phase counts recompiles from Dynamo's graph counter and says so in a note."""
    out = tmp_path / "r.json"
    proc = run_fxcache(
        "verify",
        "--python",
        torch2_python(),
        "--workloads",
        "tests.workloads.older_torch:sin_matmul",
        "--dtypes",
        "float32",
        "--dynamic",
        "true",
        "--mechanisms",
        "fxgraph",
        "--training",
        "false",
        "--cache-dir",
        str(tmp_path / "cache"),
        "--json",
        str(out),
        env={"TORCHINDUCTOR_COMPILE_THREADS": "1", "FXCACHE_TEST_DROP": "set_stance"},
        timeout=900,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (combo,) = json.loads(out.read_text())["combos"]
    assert combo["verdict"] == "safe", combo["reason"]
    assert combo["hot"]["recompiles"] == 0
    assert combo["hot"]["notes"] == [
        {
            "kind": "torch-option-missing",
            "text": "recompiles counted from Dynamo's graph count: this torch has no "
            "torch.compiler.set_stance('fail_on_recompile')",
        }
    ]
    # both phases run the second shape under fail_on_recompile (recompiles are classified by
    # comparing them), so both record that they counted graphs instead
    assert combo["cold"]["notes"] == combo["hot"]["notes"]


def test_the_supported_range_is_stated_where_users_look() -> None:
    stated = torch_support.supported_range()
    assert stated == ">= 2.6 (newest tested: 2.15.0)"
    assert f"torch {stated}" in " ".join((ROOT / "README.md").read_text().split())
    assert f"torch {stated}" in " ".join((ROOT / "docs" / "torch-versions.md").read_text().split())
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert project["tool"]["ci-fxcache"]["torch"] == {
        "minimum": "2.6",
        "newest-tested": TORCH2_VERSION,
    }
    assert torch_support.NEWEST_TESTED == TORCH2_VERSION


def test_every_known_issue_says_how_its_torch_range_was_checked() -> None:
    import yaml

    data = yaml.safe_load((ROOT / "ci_fxcache" / "report" / "known_issues.yaml").read_text())
    assert all(entry.get("checked") for entry in data["issues"])
    issues = {i.id: i for i in known_issues.load_builtin()}
    unverified = {i for i, issue in issues.items() if issue.title.endswith(known_issues.UNVERIFIED)}
    assert unverified == {e["id"] for e in data["issues"] if e.get("verified") is False}
    assert unverified == {
        "disabled-hot-load-precompile-bf16-dynamic",
        "copied-cache-dir-not-reused",
        "stale-aot-autograd-opaque-callable",
        "custom-op-backward-not-invalidating",
        # reproduced on 2.13.0 and 2.15.0 only (2.9-2.12 and 2.14 not run)
        "aot-compile-float-restart",
        "aot-mark-dynamic-guard",
        # several ranks (issue 46): the 2.13 and 2.15 sources read, the first release not searched
        "ranks-allgather-bucketing-wrapper",
        "ranks-partial-hit-hang",
    }
    # fixed upstream (pytorch#184850): present in torch 2.14.0's source, absent in 2.13.0's
    autocast = {"mechanism": "precompile", "dtype": "bfloat16-autocast", "verdict": "no-gain"}
    assert issues["precompile-autocast-guards"].applies(autocast, "2.13.0+cu128")
    assert not issues["precompile-autocast-guards"].applies(autocast, "2.14.1+cu130")
    # the AOTAutograd autocast entry (pytorch#192555): in 2.14.1's source, absent in 2.13.0's
    in_graph = {"mechanism": "precompile-api", "dtype": "bfloat16-autocast", "verdict": "safe"}
    assert issues["aot-autograd-caches-autocast-graphs"].applies(in_graph, "2.15.0+cu132")
    assert not issues["aot-autograd-caches-autocast-graphs"].applies(in_graph, "2.13.0+cpu")
    aot = {"mechanism": "aot", "dtype": "float32", "verdict": "no-gain"}
    assert issues["artifact-format-unstable"].applies(aot, "2.13.0+cpu")
    assert not issues["artifact-format-unstable"].applies({**aot, "mechanism": "mega"}, "2.15.0")


def test_ci_runs_exactly_the_readme_test_command_which_builds_the_second_torch() -> None:
    readme = (ROOT / "README.md").read_text()
    commands = re.findall(r"```bash\n(.*?)\n```", readme, re.S)
    test_command = commands[1]
    assert (ROOT / ".ci" / "run").read_text().rstrip().splitlines()[-1] == test_command
    # The constraint lifted for this one install: pip configurations that cap torch at the
    # releases on local disk (as on the development machines) would refuse torch 2.15.0.
    second = ".venv-torch2.15/bin/pip install -q torch==" + TORCH2_VERSION + " numpy"
    assert f"python3 -m venv .venv-torch2.15 && PIP_CONSTRAINT=/dev/null {second}" in test_command
