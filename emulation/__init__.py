"""Emulated clusters for tests and benchmarks: hosts in network namespaces, a 2-node Slurm; not part of the wheel."""
