"""Benchmarks at real model shapes with random weights (qwendesk-bench: `python3 -m engine.bench`), and the random
models they and the tests build."""
