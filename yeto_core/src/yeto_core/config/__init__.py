"""The run config: its schema, checks, loading, preflight, and the copy a run keeps in its store."""
