"""The worker: the only fxcache code that imports torch. It runs in the user's interpreter.

It must stay stdlib + torch only and use relative imports: the orchestrator makes this package
importable under a private name (a symlink in a temp dir on PYTHONPATH), never the toolkit's
own site-packages, so the user's packages are not shadowed.
"""
