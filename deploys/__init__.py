"""inference-nodes deploys: one ``@deploy`` per component, composed by ``deploys/all.py``.

Importing any of them reads each fact once per run while it cannot have changed (deploys/run/fact_cache.py):
pyinfra 3 would read it again when the operation executes; and each operation call finds its place in the
deploy code without reading source files (deploys/run/op_overhead.py). The entry point (deploys/all.py) also
makes each node's SSH connection send each message at once (deploys/run/ssh_nodelay.py)."""

from deploys.run import fact_cache, op_overhead

fact_cache.install()
op_overhead.install()
