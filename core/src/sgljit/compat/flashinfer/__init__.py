"""FlashInfer's call sites."""
