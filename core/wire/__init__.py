"""wire: MPI itself: the communicator interface, shared-memory windows, communicator splits."""
