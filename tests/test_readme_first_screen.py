"""README's first screen says what fxcache answers, the job's own line included, and shows the
step to add with your model; the rest lives in docs/ (issue 41, item 8)."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text(encoding="utf-8")
FIRST_SCREEN = "\n".join(README.splitlines()[:40])


def test_the_readme_is_at_most_300_lines() -> None:
    assert len(README.splitlines()) <= 300


def test_the_first_screen_answers_both_questions_and_shows_the_step() -> None:
    assert "your job: 35 of 38 graphs from the cache" in FIRST_SCREEN
    assert "safe to hot-load" in FIRST_SCREEN
    (step,) = re.findall(r"```yaml\n(.*?)```", FIRST_SCREEN, re.S)
    (uses, run) = yaml.safe_load(step)
    assert uses["uses"] == "fxcache/fxcache-action@v1" and "run" in run
    action = yaml.safe_load((ROOT / "action.yml").read_text(encoding="utf-8"))
    assert set(uses["with"]) <= set(action["inputs"]), "inputs the action does not have"
    workload = uses["with"]["workloads"]
    assert re.fullmatch(r"[\w.]+:\w+", workload) and "sin_matmul" not in workload


def test_every_docs_link_of_the_readme_and_first_run_resolves() -> None:
    """What moved out of the README is where its links say."""
    for page, text in (("README.md", README), ("docs/first-run.md", None)):
        body = text or (ROOT / page).read_text(encoding="utf-8")
        base = (ROOT / page).parent
        for target, anchor in re.findall(r"\]\(([^)#\s]+\.md)(?:#([\w-]+))?\)", body):
            path = (base / target).resolve()
            assert path.is_file(), (page, target)
            if anchor:
                slugs = {
                    re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-")
                    for h in re.findall(r"^#+ (.*)$", path.read_text(encoding="utf-8"), re.M)
                }
                assert anchor in slugs, (page, target, anchor)
