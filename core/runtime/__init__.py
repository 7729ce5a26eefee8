"""runtime: the process-wide state (init, shutdown) and the public functions."""
