"""inference-nodes deploys: one ``@deploy`` per component, composed by ``deploys/all.py``.

Importing any of them reads each fact once per run while it cannot have changed (deploys/run/fact_cache.py):
pyinfra 3 would read it again when the operation executes; and each operation call finds its place in the
deploy code without reading source files (deploys/run/op_overhead.py). The entry point (deploys/all.py) also
makes each node's SSH connection send each message at once (deploys/run/ssh_nodelay.py)."""

import pyinfra
from pyinfra import logger

from deploys.run import fact_cache, op_overhead

# The two speed-ups replace pyinfra internals, so they are on only with the pyinfra releases they were tested
# with; on another release allowed by the pin (pyproject.toml: patch releases) they stay off with a warning, and a
# converge reads each fact as pyinfra itself does: slower, the same result.
TESTED_PYINFRA = ("3.10.0",)

if pyinfra.__version__ in TESTED_PYINFRA:
    fact_cache.install()
    op_overhead.install()
else:
    logger.warning(f"pyinfra {pyinfra.__version__}: the toolkit's speed-ups (deploys/run/fact_cache.py, "
                   f"op_overhead.py) were tested with pyinfra {', '.join(TESTED_PYINFRA)} only and stay off "
                   "(facts are read as pyinfra reads them: a slower converge, the same result)")
