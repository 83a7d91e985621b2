"""agl test suite (a package, so that verl's stray top-level `tests` package cannot shadow it)."""
