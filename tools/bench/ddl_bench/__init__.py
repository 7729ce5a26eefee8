"""ddl's benchmarks, outside the product: ``ddl bench allreduce``, ``startup`` and ``rehearsal``
(the core's, against MPI's own), ``ddl bench torch`` and ``ddl bench tensorflow`` (training steps),
``ddl bench torch --memory``, and the torch-gloo peer of ``ddl bench allreduce``."""
