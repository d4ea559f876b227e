"""One module per sub-command: each has register(subparsers) and a run(args) function."""
