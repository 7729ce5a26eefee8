"""ddlrun: the launcher."""
