"""Static checks of the action, its sub-actions and the workflows: actionlint, zizmor (offline),
check-jsonschema (built-in schemas), plus the rules zizmor does not cover (no `${{ }}` in any
`run:`, remote actions pinned by SHA and kept behind `store == 'github'` in the action)."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import ROOT

ACTION_DOC = "docs/action.md"  # every input with its default, and the outputs

ACTIONS = sorted(
    p.relative_to(ROOT).as_posix() for p in [ROOT / "action.yml", *ROOT.glob("*/action.yml")]
)
WORKFLOWS = sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "workflows").glob("*.yml"))
TEST_WORKFLOWS = sorted(
    p.relative_to(ROOT).as_posix()
    for p in (ROOT / "tests").rglob("workflows/*.yml")
    if "node_modules" not in p.parts  # the browser test's npm packages ship their own CI
)
# The project's own CI (tests, the action's self-test, releases) and its Dependabot config.
OWN_WORKFLOWS = sorted(
    p.relative_to(ROOT).as_posix() for p in (ROOT / ".github" / "workflows").glob("*.yml")
)
DEPENDABOT = ".github/dependabot.yml"
SHA_PIN = re.compile(r"^[\w.-]+/[\w.-]+(/[\w./-]+)?@[0-9a-f]{40}$")
# How the reusable workflows name the fxcache action: a placeholder commit the user replaces
# with the repository and commit they reviewed (the workflows' headers say how).
PLACEHOLDER = re.compile(r"^your-org/fxcache-action(/(save|invalidate|toolkit))?@0{40}$")
# Every file a user's job runs or copies (the JavaScript, the install script, the workflows).
SHIPPED = sorted(
    p.relative_to(ROOT).as_posix()
    for p in [*ROOT.glob("*/action.yml"), ROOT / "action.yml", *(ROOT / "js").glob("*.js"),
              *ROOT.glob("*/main.js"), *(ROOT / "scripts").glob("*"),
              *(ROOT / "workflows").glob("*.yml")]
)  # fmt: skip


def _tool(name: str) -> str:
    exe = Path(sys.executable).with_name(name)
    found = str(exe) if exe.exists() else shutil.which(name)
    assert found, f"{name} is not installed: run the README's test set-up command"
    return found


def _run(*argv: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, cwd=cwd, capture_output=True, text=True, check=False)


def _load(rel: str) -> dict[Any, Any]:
    doc = yaml.safe_load((ROOT / rel).read_text())
    assert isinstance(doc, dict)
    return doc


def _steps(doc: dict[Any, Any]) -> list[dict[str, Any]]:
    if "runs" in doc:
        return list(doc["runs"].get("steps", []))
    return [s for job in doc["jobs"].values() for s in job.get("steps", [])]


def test_inventory() -> None:
    assert ACTIONS == [
        "action.yml",
        "invalidate/action.yml",
        "save/action.yml",
        "toolkit/action.yml",
    ]
    assert WORKFLOWS == [
        "workflows/fxcache-comment-fork.yml",
        "workflows/fxcache-invalidate.yml",
        "workflows/fxcache-verify.yml",
    ]
    assert TEST_WORKFLOWS, "the act end-to-end workflow is missing"
    assert OWN_WORKFLOWS == [
        ".github/workflows/release.yml",
        ".github/workflows/self-test.yml",
        ".github/workflows/tests.yml",
    ]


def test_actionlint(tmp_path: Path) -> None:
    proc = _run(
        _tool("actionlint"), "-config-file", ".github/actionlint.yaml", *WORKFLOWS, *OWN_WORKFLOWS
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # The act workflows, where they are, in a project without .github/workflows/: fleet.yml
    # calls ./.github/workflows/fxcache-verify.yml, which only the act test's repository has.
    (tmp_path / ".git").mkdir()  # actionlint finds the project root by it
    for rel in TEST_WORKFLOWS:
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / rel, tmp_path / rel)
    config = str(ROOT / ".github/actionlint.yaml")
    proc = _run(_tool("actionlint"), "-config-file", config, *TEST_WORKFLOWS, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_actionlint_catches_an_undeclared_runner_label(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yml"
    text = (ROOT / "workflows/fxcache-invalidate.yml").read_text()
    bad.write_text(text.replace("gpu-l4]", "gpu-l40s]"))
    proc = _run(_tool("actionlint"), "-config-file", ".github/actionlint.yaml", str(bad))
    assert proc.returncode == 1
    assert 'label "gpu-l40s" is unknown' in proc.stdout


def _zizmor(*paths: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return _run(_tool("zizmor"), "--offline", "--no-progress", *paths, cwd=cwd)


def test_zizmor_has_no_findings() -> None:
    # The auditor persona: every audit, including the pedantic ones (undocumented permissions).
    proc = _zizmor("--persona=auditor", *ACTIONS, *WORKFLOWS)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert "No findings to report" in out, out
    # zizmor only warns about files it cannot parse: make that a failure.
    assert "failed to" not in out.lower(), out
    for path in [*ACTIONS, *WORKFLOWS]:
        assert f"completed {path}" in out, f"zizmor did not audit {path}:\n{out}"


def test_zizmor_has_no_findings_in_the_projects_own_ci() -> None:
    """The repository's workflows and Dependabot config, under the same policy. Their
    `uses: ./` (the action tried on itself, the tests workflow called by the release) carry an
    inline ignore of the self-repository audit, with the reason."""
    proc = _zizmor("--persona=auditor", *OWN_WORKFLOWS, DEPENDABOT)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0 and "No findings to report" in out, out
    assert "failed to" not in out.lower(), out
    for path in [*OWN_WORKFLOWS, DEPENDABOT]:
        assert f"completed {path}" in out, f"zizmor did not audit {path}:\n{out}"


def _copy_repo_config(dest: Path) -> None:
    (dest / ".github").mkdir(parents=True)
    shutil.copy(ROOT / ".github/zizmor.yml", dest / ".github/zizmor.yml")


def test_zizmor_flags_an_input_expanded_inside_run(tmp_path: Path) -> None:
    _copy_repo_config(tmp_path)
    text = (ROOT / "toolkit/action.yml").read_text()
    injected = text.replace(
        """run: '/bin/bash "$FXCACHE_ACTION_ROOT/scripts/install-toolkit.sh"'""",
        """run: echo ${{ inputs.python }}""",
        1,
    )
    assert injected != text
    (tmp_path / "action.yml").write_text(injected)
    proc = _zizmor("action.yml", cwd=tmp_path)
    assert proc.returncode != 0
    assert "template-injection" in proc.stdout


def test_fork_comment_trigger_is_ignored_deliberately_not_by_accident(tmp_path: Path) -> None:
    """Without its `zizmor: ignore[dangerous-triggers]` comment the workflow_run is flagged."""
    _copy_repo_config(tmp_path)
    text = (ROOT / "workflows/fxcache-comment-fork.yml").read_text()
    assert "workflow_run: # zizmor: ignore[dangerous-triggers] never runs PR code" in text
    stripped = re.sub(r" # zizmor: ignore\[dangerous-triggers\].*", "", text)
    (tmp_path / "fork.yml").write_text(stripped)
    proc = _zizmor("fork.yml", cwd=tmp_path)
    assert proc.returncode != 0
    assert "dangerous-triggers" in proc.stdout


@pytest.mark.parametrize(
    ("pattern", "tag"),
    [(r"actions/download-artifact@[0-9a-f]{40}", "actions/download-artifact@v8"),
     (r"your-org/fxcache-action/toolkit@0{40}", "fxcache/fxcache-action/toolkit@v1")],
)  # fmt: skip
def test_zizmor_config_requires_sha_pins_for_every_action_ours_too(
    tmp_path: Path, pattern: str, tag: str
) -> None:
    _copy_repo_config(tmp_path)
    text = (ROOT / "workflows/fxcache-comment-fork.yml").read_text()
    unpinned = re.sub(pattern, tag, text)
    assert unpinned != text
    (tmp_path / "fork.yml").write_text(unpinned)
    proc = _zizmor("fork.yml", cwd=tmp_path)
    assert proc.returncode != 0
    assert "unpinned-uses" in proc.stdout


@pytest.mark.parametrize(
    ("schema", "files"),
    [("vendor.github-actions", ACTIONS),
     ("vendor.github-workflows", WORKFLOWS + TEST_WORKFLOWS + OWN_WORKFLOWS),
     ("vendor.dependabot", [DEPENDABOT])],
)  # fmt: skip
def test_check_jsonschema(schema: str, files: list[str]) -> None:
    proc = _run(_tool("check-jsonschema"), "--builtin-schema", schema, *files)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "ok -- validation done" in proc.stdout


def test_check_jsonschema_rejects_a_broken_action(tmp_path: Path) -> None:
    doc = _load("action.yml")
    doc["runs"].pop("main")  # a JavaScript action must name its main script
    bad = tmp_path / "action.yml"
    bad.write_text(yaml.safe_dump(doc))
    proc = _run(_tool("check-jsonschema"), "--builtin-schema", "vendor.github-actions", str(bad))
    assert proc.returncode == 1


@pytest.mark.parametrize("rel", ACTIONS + WORKFLOWS + TEST_WORKFLOWS + OWN_WORKFLOWS)
def test_no_expression_inside_run(rel: str) -> None:
    for step in _steps(_load(rel)):
        if "run" in step:
            assert "${{" not in step["run"], f"{rel}: step {step.get('name')!r} expands ${{{{ }}}}"


@pytest.mark.parametrize("rel", ACTIONS + WORKFLOWS + OWN_WORKFLOWS)
def test_remote_actions_are_pinned(rel: str) -> None:
    for step in _steps(_load(rel)):
        uses = step.get("uses")
        if uses and not uses.startswith("./"):
            assert SHA_PIN.match(uses), f"{rel}: {uses} is not pinned by commit"


@pytest.mark.parametrize("rel", ACTIONS)
def test_the_actions_use_no_other_action(rel: str) -> None:
    """The action and its save / invalidate sub-actions are JavaScript actions and the toolkit
    one a single `run:` step: none calls another action (ours included), so a job pinned by
    commit, a mirror under another owner and act without network run exactly this tree; the
    GitHub cache goes through the toolkit (ci_fxcache/store/remote/github/cache_service.py)."""
    doc = _load(rel)
    assert [s for s in _steps(doc) if "uses" in s] == [], rel
    if rel != "toolkit/action.yml":
        assert doc["runs"]["using"] == "node24", rel
        for script in ("main", "post"):
            if script in doc["runs"]:
                assert (ROOT / Path(rel).parent / doc["runs"][script]).is_file(), (rel, script)
    assert doc["runs"].get("post-if", "always()") == "always()"


@pytest.mark.parametrize("rel", SHIPPED)
def test_no_shipped_file_names_the_upstream_action(rel: str) -> None:
    """No action, script or reusable workflow refers to `fxcache/fxcache-action`: the
    workflows name our actions only by the placeholder their headers tell users to pin."""
    text = (ROOT / rel).read_text()
    assert "fxcache/fxcache-action" not in text, rel
    for step in _steps(_load(rel)) if rel.endswith(".yml") else []:
        uses = step.get("uses", "")
        if "fxcache-action" in uses:
            assert PLACEHOLDER.match(uses), f"{rel}: {uses}"
    if rel.startswith("workflows/") and "fxcache-action" in text:
        assert "Pinning: this file names the fxcache action" in text, rel


def test_action_inputs_and_outputs_are_documented() -> None:
    doc = _load("action.yml")
    docs = (ROOT / ACTION_DOC).read_text()
    for name in doc["inputs"]:  # the names themselves: tests/test_action_steps.py
        assert f"| `{name}` |" in docs, f"{ACTION_DOC}'s input table lacks {name}"
    for name in doc["outputs"]:
        assert f"`{name}`" in docs, f"{ACTION_DOC} does not name the output {name}"
    for name, spec in doc["inputs"].items():
        assert spec.get("description", "").strip(), name
        assert "default" in spec, name
    assert doc["inputs"]["github-token"]["default"] == "${{ github.token }}"
    for rel in ACTIONS:
        for name, spec in _load(rel).get("inputs", {}).items():
            assert spec.get("description", "").strip() and "default" in spec, f"{rel}: {name}"


def test_shellcheck_on_the_remaining_shell() -> None:
    scripts = sorted(str(p) for p in (ROOT / "scripts").glob("*.sh"))
    assert [Path(p).name for p in scripts] == ["install-toolkit.sh"]
    proc = _run(_tool("shellcheck"), "--severity=style", *scripts)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_workflows_start_with_no_permissions() -> None:
    for rel in WORKFLOWS:
        doc = _load(rel)
        assert doc["permissions"] == {}, rel
        for name, job in doc["jobs"].items():
            assert "permissions" in job, f"{rel}: job {name} must state its permissions"


def test_readme_workflow_examples_lint(tmp_path: Path) -> None:
    """The complete workflow examples of the README and the action's docs are valid as written
    (copy-paste ready)."""
    workflows = []
    for rel in ("README.md", ACTION_DOC):
        blocks = re.findall(r"```yaml\n(.*?)```", (ROOT / rel).read_text(), flags=re.S)
        found = [b for b in blocks if b.startswith("name:")]
        assert found, f"{rel} lost its workflow examples"
        workflows += found
    wf_dir = tmp_path / ".github" / "workflows"
    wf_dir.mkdir(parents=True)
    (tmp_path / ".git").mkdir()  # actionlint finds the project root by it
    shutil.copy(ROOT / ".github/actionlint.yaml", tmp_path / ".github/actionlint.yaml")
    # The fleet example calls the reusable workflow copied into the user's repository.
    shutil.copy(ROOT / "workflows/fxcache-verify.yml", wf_dir / "fxcache-verify.yml")
    files = []
    for i, text in enumerate(workflows):
        path = wf_dir / f"example{i}.yml"
        path.write_text(text)
        files.append(str(path))
    proc = _run(_tool("actionlint"), *files, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    proc = _run(_tool("check-jsonschema"), "--builtin-schema", "vendor.github-workflows", *files)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_documented_matrix_defaults_are_verifys() -> None:
    """The action's empty matrix inputs mean verify's defaults: action.yml and the input table
    (docs/action.md) say which, and must keep saying the truth."""
    import argparse

    from ci_fxcache import cli
    from ci_fxcache.verify import matrix

    action_inputs = _load("action.yml")["inputs"]
    descriptions = {k: " ".join(v["description"].split()) for k, v in action_inputs.items()}
    readme = (ROOT / ACTION_DOC).read_text()
    inputs = {axis: axis for axis in ("dtypes", "dynamic", "mechanisms", "training", "workloads")}
    inputs["devices"] = "device"
    for axis, name in inputs.items():
        expected = ",".join(str(v).lower() for v in matrix.DEFAULTS[axis])
        assert action_inputs[name]["default"] == ""
        assert f"Empty: verify's default, {expected}" in descriptions[name], name
        assert f"| `{name}` | `{expected}` |" in readme, name
    sub = next(a for a in cli.build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    # no time floor unless asked for: the verdict rests on what the hot process compiled
    assert sub.choices["verify"].get_default("min_speedup") is None
    assert "Empty: verify's default, none " in descriptions["min-speedup"]
    assert "| `min-speedup` | empty | none:" in readme


@pytest.mark.parametrize("rel", OWN_WORKFLOWS)
def test_own_ci_pins_with_a_version_comment_and_least_permissions(rel: str) -> None:
    """The project's workflows as the README tells users to write theirs: each remote action
    by full commit with its version in a comment (what Dependabot updates), no permissions at
    the top and each job's own, and no token left in .git by a checkout."""
    doc = _load(rel)
    assert doc["permissions"] == {}, rel
    for name, job in doc["jobs"].items():
        assert "permissions" in job, f"{rel}: job {name} must state its permissions"
        if "uses" in job:  # a reusable workflow of this repository
            assert job["uses"].startswith("./.github/workflows/"), (rel, name)
    text = (ROOT / rel).read_text()
    for line in re.findall(r"uses: ([^./\s][^\s]*.*)", text):
        assert re.fullmatch(r"[\w.-]+/[\w.-]+@[0-9a-f]{40} # v\d+\.\d+\.\d+", line), line
    for step in _steps(doc):
        if step.get("uses", "").startswith("actions/checkout@"):
            assert step.get("with", {}).get("persist-credentials") is False, (rel, step)


def _readme_test_command() -> str:
    blocks = re.findall(r"```bash\n(.*?)\n```", (ROOT / "README.md").read_text(), flags=re.S)
    found = [b for b in blocks if "-m pytest" in b]
    assert len(found) == 1, "the README's test command is not one bash block"
    return found[0].strip()


def test_ci_runs_the_readme_test_command_exactly() -> None:
    """The tests workflow's last step and .ci/run are the README's test command, verbatim."""
    command = _readme_test_command()
    steps = _load(".github/workflows/tests.yml")["jobs"]["tests"]["steps"]
    assert steps[-1]["run"].strip() == command
    assert (ROOT / ".ci/run").read_text().rstrip().splitlines()[-1] == command


def test_dependabot_covers_every_pinned_dependency() -> None:
    """Every npm package of the tests, the toolkit's locks and the workflows' actions."""
    doc = _load(DEPENDABOT)
    dirs: dict[str, set[str]] = {}
    for update in doc["updates"]:
        found = update.get("directories") or [update["directory"]]
        dirs.setdefault(update["package-ecosystem"], set()).update(found)
        assert update.get("cooldown", {}).get("default-days", 0) >= 1, update
    packages = {
        "/" + p.parent.relative_to(ROOT).as_posix()
        for p in ROOT.rglob("package.json")
        if "node_modules" not in p.parts and not p.relative_to(ROOT).parts[0].startswith(".")
    }
    assert dirs["npm"] == packages
    assert dirs["pip"] == {"/toolkit"} and list((ROOT / "toolkit").glob("requirements*.txt"))
    assert dirs["github-actions"] == {"/"}


def _visible(text: str) -> str:
    """The GitLab template's hidden job made a visible one, as a job that extends it is (the
    schema does not look inside hidden jobs)."""
    assert text.count("\n.fxcache:\n") == 1
    return text.replace("\n.fxcache:\n", "\nfxcache:\n  script: [train]\n")


@pytest.mark.parametrize(
    ("schema", "rel", "old", "new"),
    [("vendor.gitlab-ci", "ci/gitlab/fxcache.gitlab-ci.yml", "when: always", "when: sometimes"),
     ("vendor.buildkite", "ci/buildkite/pipeline.yml", "artifact_paths:", "artefact_paths:")],
)  # fmt: skip
def test_other_ci_files_match_their_schemas(
    schema: str, rel: str, old: str, new: str, tmp_path: Path
) -> None:
    text = (ROOT / rel).read_text()
    text = _visible(text) if rel.startswith("ci/gitlab/") else text
    for content, expected in ((text, 0), (text.replace(old, new, 1), 1)):
        path = tmp_path / Path(rel).name
        path.write_text(content)
        proc = _run(_tool("check-jsonschema"), "--builtin-schema", schema, str(path))
        assert proc.returncode == expected, proc.stdout + proc.stderr
