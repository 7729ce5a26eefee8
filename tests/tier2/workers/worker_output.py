"""Tier-2 worker: every rank writes many lines in pieces, unbuffered, to both streams."""

import sys

import ddl

ddl.init()
r = ddl.rank()
for i in range(300):
    sys.stdout.write(f"rank {r} line {i} ")
    sys.stdout.flush()
    sys.stdout.write("end\n")
    sys.stdout.flush()
    if i % 50 == 0:
        sys.stderr.write(f"rank {r} note {i}\n")
        sys.stderr.flush()
