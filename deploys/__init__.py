"""inference-nodes deploys: one ``@deploy`` per component, composed by ``deploys/all.py``.

Importing any of them reads each fact once per run while it cannot have changed (deploys/fact_cache.py):
pyinfra 3 would read it again when the operation executes."""

from deploys import fact_cache

fact_cache.install()
