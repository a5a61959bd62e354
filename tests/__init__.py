"""ragidx's tests: run with pytest from the repository root (see docs/development.md)."""
