"""One module per `fxcache` subcommand; each defines `register(subparsers, parent)`, which
declares its options and sets `func`: a typed function whose keyword-only parameters are the
parsed options (`ci_fxcache.cli.main` calls it with them)."""
