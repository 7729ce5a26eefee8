"""Benchmarks that print tables and write JSON and plots (``ddl bench ...``)."""
