"""Fault injection helpers for the verification tests."""

from __future__ import annotations

import stat
from pathlib import Path

# Appended to Inductor's generated wrapper modules: every floating output gets +1, as a
# corrupted cache entry would compute wrong values while still loading as a "hit".
_WRONG_CALL = """

_fxcache_original_call = call


def call(args):
    outs = _fxcache_original_call(args)
    return [o + 1 if isinstance(o, torch.Tensor) and o.is_floating_point() else o for o in outs]
"""


def tamper_generated_code(cache_dir: Path) -> int:
    """Make every generated wrapper module under `cache_dir` return wrong values; the count."""
    count = 0
    for path in cache_dir.rglob("*.py"):
        text = path.read_text()
        if "def call(" in text and "runner.call" in text:
            path.write_text(text + _WRONG_CALL)
            count += 1
    return count


# Inside an artifact's generated C++ kernel for `sin_matmul` (`x.sin() @ y`): the vectorised
# sine. Swapping it for a cosine of the same length keeps every length and offset of the file
# (pickles, `torch.save` archives) valid, so the artifact still loads and computes other values.
SIN_KERNEL, COS_KERNEL = b"tmp0.sin()", b"tmp0.cos()"


def tamper_sine(path: Path) -> int:
    """Make the sine kernels in the file at `path` compute a cosine; how many were changed."""
    data = path.read_bytes()
    count = data.count(SIN_KERNEL)
    path.write_bytes(data.replace(SIN_KERNEL, COS_KERNEL))
    return count


def truncate(path: Path, keep: float = 0.5) -> None:
    """Cut the file at `path` to a fraction of its size, as an interrupted copy would; a
    read-only file (as the store leaves them) is made writable first, as its owner can."""
    data = path.read_bytes()
    path.chmod(path.stat().st_mode | stat.S_IWUSR)
    path.write_bytes(data[: int(len(data) * keep)])
