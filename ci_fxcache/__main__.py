"""`python -m ci_fxcache` is the same as the `fxcache` command."""

from ci_fxcache.cli import entry

entry()
