"""pyinfra facts of inference-nodes (read-only; each is one command on the node)."""
