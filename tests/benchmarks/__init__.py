"""Scripts that print numbers: run each from the repository root as ``python -m tests.benchmarks.NAME``."""
