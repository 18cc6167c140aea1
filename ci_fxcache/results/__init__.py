"""Results documents: the schema, writing one runner's results, reading any version."""
