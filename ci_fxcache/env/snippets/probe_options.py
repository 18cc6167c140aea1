# Runs in the TARGET interpreter with `python -c SOURCE PROBES`: imports torch and prints its
# version and which options of PROBES (JSON {name: [module, attribute, marker]}) it has; an
# option with a marker counts only when the attribute's source mentions it.
# See ci_fxcache/env/torch_support.py.
import importlib
import inspect
import json
import sys
import warnings

warnings.filterwarnings("ignore")
import torch

present = {}
for name, (module, attribute, marker) in sorted(json.loads(sys.argv[1]).items()):
    try:
        found = getattr(importlib.import_module(module), attribute)
        present[name] = not marker or marker in inspect.getsource(found)
    except Exception:
        present[name] = False
print(json.dumps({"torch_version": torch.__version__, "options": present}))
