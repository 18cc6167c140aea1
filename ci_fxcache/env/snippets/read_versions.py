# Runs in the TARGET interpreter with `python -c`: stdlib only, never imports torch.
# Prints one JSON object: interpreter facts plus torch/triton versions read from package
# metadata and torch/version.py (parsed with ast, not executed).
import ast
import json
import os
import sys
import sysconfig

if sys.path and sys.path[0] in ("", os.getcwd()):
    del sys.path[0]  # a `torch/` folder in the working directory must not win

import importlib.util

out = {
    "python_executable": sys.executable,
    "python_implementation": sys.implementation.name,
    "python_version": "%d.%d.%d" % sys.version_info[:3],
    "python_abiflags": getattr(sys, "abiflags", ""),
    "python_gil_disabled": bool(sysconfig.get_config_var("Py_GIL_DISABLED")),
    "torch_path": None,
    "torch_version_py": None,
    "triton_version": None,
    "error": None,
}
try:
    spec = importlib.util.find_spec("torch")
except Exception as exc:  # a broken torch package
    spec = None
    out["error"] = "find_spec failed: %s" % exc
if spec is not None and spec.submodule_search_locations:
    pkg_dir = list(spec.submodule_search_locations)[0]
    out["torch_path"] = pkg_dir
    version_file = os.path.join(pkg_dir, "version.py")
    try:
        with open(version_file, encoding="utf-8") as fh:
            tree = ast.parse(fh.read(), version_file)
        values = {}
        for node in tree.body:
            if isinstance(node, ast.Assign):
                targets, value = node.targets, node.value
            elif isinstance(node, ast.AnnAssign) and node.value is not None:
                targets, value = [node.target], node.value
            else:
                continue
            for target in targets:
                if isinstance(target, ast.Name):
                    try:
                        values[target.id] = ast.literal_eval(value)
                    except ValueError:
                        pass
        out["torch_version_py"] = {
            k: values.get(k) for k in ("__version__", "git_version", "cuda", "hip", "xpu")
        }
    except (OSError, SyntaxError, UnicodeDecodeError) as exc:
        out["error"] = "cannot read %s: %s" % (version_file, exc)

# triton ships as triton / pytorch-triton / pytorch-triton-rocm / pytorch-triton-xpu. Look for
# its dist-info beside the package (a directory listing) before falling back to
# importlib.metadata, which scans every distribution on sys.path and is slow in big venvs.
TRITON_DISTS = ("triton", "pytorch_triton", "pytorch_triton_rocm", "pytorch_triton_xpu")
try:
    triton_spec = importlib.util.find_spec("triton")
except Exception:
    triton_spec = None
if triton_spec is not None and triton_spec.submodule_search_locations:
    site_dir = os.path.dirname(list(triton_spec.submodule_search_locations)[0])
    for entry in sorted(os.listdir(site_dir)):
        name, _, rest = entry.partition("-")
        if rest.endswith(".dist-info") and name.lower().replace("-", "_") in TRITON_DISTS:
            out["triton_version"] = rest[: -len(".dist-info")]
            out["triton_dist"] = name
            break
    else:
        from importlib import metadata

        for dist in TRITON_DISTS:
            try:
                out["triton_version"] = metadata.version(dist)
                out["triton_dist"] = dist
                break
            except metadata.PackageNotFoundError:
                continue
print(json.dumps(out))
