"""ddlrun's watch over every rank: each rank runs under a keeper that reports to ddlrun.

``ddlrun`` (not ``--elastic``) starts each rank as ``python -m ddl.launcher.watch.keeper
-- COMMAND``: the keeper starts the rank, passes its output to ``ddlrun`` line by line, and
reports how it ended (its status or signal, its last lines on stderr, what ddl told it:
:mod:`ddl.base.notes`), then removes the shared memory the rank left. ``ddlrun`` decides
from these reports (:mod:`~ddl.launcher.watch.verdict`, a pure function) when the job has
failed and ends it within seconds, with the first failing rank's own status, whatever
the launcher underneath (hydra, Slurm through hydra, Open MPI) would have done.

Modules: :mod:`~ddl.launcher.watch.protocol` (the messages), :mod:`~ddl.launcher.watch.keeper`
(the per-rank process), :mod:`~ddl.launcher.watch.verdict` (the decisions),
:mod:`~ddl.launcher.watch.server` (ddlrun's listener), :mod:`~ddl.launcher.watch.output`
(rank-tagged, line-whole output and ``--log-dir``), :mod:`~ddl.launcher.watch.watched_job` (ddlrun's loop).
"""
