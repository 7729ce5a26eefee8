"""ddl's benchmarks against its peers, outside the product: ``ddl bench torch`` and ``ddl bench tensorflow``
(training steps), ``ddl bench torch --memory``, and the torch-gloo peer of ``ddl bench allreduce``."""
