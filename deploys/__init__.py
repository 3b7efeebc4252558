"""inference-nodes deploys: one ``@deploy`` per component, composed by ``deploys/all.py``."""
