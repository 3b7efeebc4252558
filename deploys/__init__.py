"""inference-nodes deploys: one ``@deploy`` per component, composed by ``deploys/all.py``.

Every fact a component reads goes through deploys/run/reads.py (each read once while the node cannot have
changed, many in one command); the entry point (deploys/all.py) also makes each node's SSH connection send each
message at once (deploys/run/ssh_nodelay.py). Neither replaces any part of pyinfra: any release the pin allows
(pyproject.toml) runs them as it is."""
