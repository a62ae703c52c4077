"""Test support: doubles and rigs the tests (and the benchmarks) use; never shipped."""
