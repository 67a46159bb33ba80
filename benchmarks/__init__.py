"""The benchmark suites behind the figures in docs/: `python -m benchmarks --help` lists them."""
