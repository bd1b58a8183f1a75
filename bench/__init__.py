"""Benchmarks (bench/README.md); run each as `python -m bench.<name>`."""
