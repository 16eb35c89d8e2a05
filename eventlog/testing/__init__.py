"""Helpers for testing against real engines; shared by the test suite and the benchmarks."""
