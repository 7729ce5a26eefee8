"""Trains each solver given on the command line with ddl-caffe's Solver in one MPI job; rank 0 writes the weights
of rank 0, every rank's weight digest and where the reduction's time went to OUT/<solver stem>.npz/.json."""

import hashlib
import json
import sys
from pathlib import Path

import numpy as np
import torch

import ddl
from ddl.caffe.formats.protofile import read_solver
from ddl.caffe.solver.solver import Solver

torch.set_num_threads(1)
ddl.init()
out = Path(sys.argv[1])
for path in sys.argv[2:]:
    solver = Solver(read_solver(path), rank=ddl.rank(), size=ddl.size())
    solver.solve()
    weights = [p.tensor.detach().numpy().copy() for p in solver.params]
    digest = hashlib.sha256(b"".join(w.tobytes() for w in weights)).hexdigest()
    digests = ddl.allgather_object(digest, name="equivalence.digests")
    if ddl.rank() == 0:
        assert solver.exchange is not None
        times = solver.exchange.times
        np.savez(out / f"{Path(path).stem}.npz", *weights)
        (out / f"{Path(path).stem}.json").write_text(json.dumps({
            "digests": digests, "iterations": times.iterations, "span": times.span, "exposed": times.exposed}))
    solver.exchange.close()  # type: ignore[union-attr]
ddl.shutdown()
