"""Runs `ddl-caffe train` once per solver given on the command line, in one MPI job (saves start-ups)."""

import sys

from ddl.caffe.command.cli import main

for solver in sys.argv[1:]:
    code = main(["train", "--solver", solver, "--ddl", "-mode r:2", "--threads", "1"])
    if code:
        sys.exit(code)
