"""base: the vocabulary every layer shares: errors, reduction ops, dtypes, topology, settings."""
