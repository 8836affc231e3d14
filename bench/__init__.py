"""Benchmark harness for the triton-embed model repository (see bench/README.md, `python -m bench.run --help`)."""
