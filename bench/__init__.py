"""The benchmarks (bench/README.md). A package so that `bench.economy` imports from the
repository root (`python -m bench.economy`, and pytest's `pythonpath`); the other bench scripts
still run as scripts (`python bench/engine.py`).
"""
