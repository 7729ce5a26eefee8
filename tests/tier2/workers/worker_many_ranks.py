"""Tier-2 worker: small and larger allreduces at 17 ranks or more on one host. Through
shared memory (the default there) the engine's records keep 4 KiB (a 4 KiB call rides in
them); over MPI's gather (DDL_SHARED_NEGOTIATION=off) they shrink to 128 bytes (an 8-byte
call rides in them; 4 KiB does not) and, with the ranks outnumbering the cores, the gather
waits in MPI's own wait. Prints one line per rank. Used by tests/tier2/test_mpi.py."""

import numpy as np

import ddl
from ddl.runtime import lifecycle

ddl.init()
rank, size = ddl.rank(), ddl.size()
eng = lifecycle.engine()
ok = True
for n in (2, 22, 23, 1024, 1 << 18):  # 8 B, 88 B (a record's payload), 92 B, 4 KiB, 1 MiB
    x = np.arange(n, dtype=np.float32) + rank
    before = eng.inline_cycles
    for _ in range(3):
        y = x.copy()
        ddl.allreduce_(y, op=ddl.Sum, name=f"x{n}")
        ok = ok and bool(np.array_equal(y, np.arange(n, dtype=np.float32) * size + size * (size - 1) / 2))
    rode = eng.inline_cycles - before
    ok = ok and (rode == 3) == (n * 4 <= eng.exchange.inline_capacity)
print(f"RANK {rank} ok={ok} inline={eng.exchange.inline_capacity} record={eng.exchange.record_bytes} "
      f"blocks={eng.ctx.comm.negotiation_blocks} shared={eng.ctx.comm.shared_negotiation}", flush=True)
ddl.shutdown()
