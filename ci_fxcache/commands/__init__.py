"""One module per `fxcache` subcommand; each defines `register(subparsers, parent)`."""
