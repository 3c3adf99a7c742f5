"""One module per `mpa` sub-command; each defines `add_arguments(parser)` and `run(args, config) -> int`."""
