"""vLLM's call sites."""
