"""Benchmarks of eventlog against raw drivers and the eventsourcing library (`python -m bench`)."""
