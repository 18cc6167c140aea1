"""The actions' JavaScript (js/fxcache.js) under node's own test runner (tests/js/), run from
here so that the suite runs it: steps in order and in groups, each with only its secrets, every
line of a secret masked, the post step running only the toolkit main installed."""

from __future__ import annotations

import shlex
import shutil
import subprocess
import sys

from tests.conftest import ROOT


def test_node_test_runner() -> None:
    node = shutil.which("node")
    assert node, "node is not installed (the actions run on node; install it to test them)"
    tests = sorted(str(p) for p in (ROOT / "tests" / "js").glob("*.test.js"))
    assert tests
    env = {"PATH": "/usr/bin:/bin", "REAL_FXCACHE": f"{shlex.quote(sys.executable)} -m ci_fxcache"}
    proc = subprocess.run(
        [node, "--test", *tests], cwd=ROOT, env=env, capture_output=True, text=True, check=False
    )
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-2000:]
    assert "# fail 0" in proc.stdout and "# pass 0" not in proc.stdout, proc.stdout
