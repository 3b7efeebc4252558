"""The run machinery under every component: per-run state (state.py), the one way facts are read (reads.py:
each read once while the node cannot have changed, many in one command) and TCP_NODELAY on the nodes' SSH
connections (ssh_nodelay.py)."""
