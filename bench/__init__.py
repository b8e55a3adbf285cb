"""Benchmarks: `python -m bench --quick|--full` runs every scenario and writes bench/results/."""
