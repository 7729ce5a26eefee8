"""The repository's tools (not installed): harnesses and benchmarks against peers, run from a checkout with ``python -m tools...``."""
