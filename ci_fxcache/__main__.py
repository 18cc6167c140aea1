"""`python -m ci_fxcache` is the same as the `fxcache` command."""

import sys

from ci_fxcache.cli import main

sys.exit(main())
