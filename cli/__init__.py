"""The `rlhf` command line: one thin Typer command per stage, plus query, audit and doctor."""
