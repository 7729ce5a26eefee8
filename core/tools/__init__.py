"""tools: the ddl commands: plan, doctor, bench, conformance."""
