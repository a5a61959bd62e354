"""The parts of the ``ragidx`` command beside its everyday commands (``ragidx/cli.py``): the options
several commands share, how results are printed, and the research commands (calibrate, eval,
bench). Like the CLI, they parse, call the library and print; nothing in ``app`` imports them but
this package, and they reach the engine only through ``app``."""
