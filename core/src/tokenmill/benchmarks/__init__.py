"""Benchmarks: fixed workloads run by each engine in its own process, reported as ratios."""
