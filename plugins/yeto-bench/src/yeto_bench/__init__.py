"""Benchmarks behind ``yeto bench``."""
