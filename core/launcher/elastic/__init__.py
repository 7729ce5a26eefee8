"""``ddlrun --elastic``: a supervisor that runs one ``mpiexec`` world per membership and carries the state across.

The MPI that pip installs (MPICH 5, ch4) cannot keep a world going once a rank is lost
(``MPIR_CVAR_ENABLE_FT=1`` fails at ``MPI_Init``; without it the survivors die at their
next call to the lost rank), so ddl recovers by *supervised relaunch*:

1. one agent per host of the list (:mod:`~ddl.launcher.elastic.agent`), started once and
   kept: host liveness (heartbeats, :mod:`~ddl.launcher.elastic.timing`) and warm,
   pre-imported interpreters that each rank is forked from;
2. one ``mpiexec`` per world, whose ranks are stubs (:mod:`~ddl.launcher.elastic.stub`)
   handing over to their host's agent; ``-disable-auto-cleanup``: ddlrun, not hydra, ends worlds;
3. on a lost host (its agent's connection closes, it misses its heartbeats, or a rank
   there is killed by a signal), ddlrun stops the world's other ranks and starts the next
   world on the hosts left, if at least ``--min-np`` ranks remain; the ranks sync from the
   newest commit kept on a survivor's tmpfs (:mod:`ddl.runtime.elastic`);
4. when discovery lists new (or returning) hosts, their agents warm up first; then ddlrun
   announces the change, every rank leaves at its next commit (status 75), and the next
   world includes them, up to ``--max-np``.

A rank that exits with an error of its own (not a lost host) ends the job with its status,
as without ``--elastic``. The decisions are pure state machines (``host``, ``world``,
``job``, ``agent_machine``) over the messages of :mod:`ddl.runtime.elastic.protocol`;
``supervisor`` and ``agent`` are the loops around them.
"""
