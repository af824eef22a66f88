"""LayerSkip self-speculation: the target drafts with a subset of its own layers."""
