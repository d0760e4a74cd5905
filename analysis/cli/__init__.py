"""The command line: one module per command, each with ``register`` (its arguments and help) and
``run`` (the work, returning the exit status); ``main`` builds the parser and maps errors to
exit statuses. Commands call the feature packages; nothing outside this package imports it."""

from clustersim.analysis.cli.main import build_parser, main

__all__ = ["build_parser", "main"]
