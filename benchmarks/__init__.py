"""Benchmarks: torchflex side by side with the reference systems (make bench)."""
