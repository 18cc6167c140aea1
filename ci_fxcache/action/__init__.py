"""The GitHub Action's logic: inputs, trust, defaults and step outputs, one step at a time.

The action's YAML files only call `fxcache action <step>` (ci_fxcache/commands/action.py) and
pinned actions; every decision lives here.
"""
