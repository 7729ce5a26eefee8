"""ddl.torch adapter: filled in by a later issue."""
