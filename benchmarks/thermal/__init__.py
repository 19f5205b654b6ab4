"""Helpers of benchmarks/thermal_policy.py (not part of gpumond)."""
