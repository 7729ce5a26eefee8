"""ddl.tensorflow adapter: filled in by a later issue."""
