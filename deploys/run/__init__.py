"""The run machinery under every component: per-run state (state.py), each fact read once per run
(fact_cache.py), cheaper per-operation-call work in pyinfra (op_overhead.py) and TCP_NODELAY on the nodes' SSH
connections (ssh_nodelay.py). deploys/__init__.py installs fact_cache and op_overhead on import."""
