"""The helpers the deploys send to nodes: stdlib-only programs, scripts and data files, one folder per component.

Deploys find them with :func:`helper_path` (the one place that knows where this folder is on the control node).
"""

from __future__ import annotations

import os

ROOT = os.path.dirname(os.path.abspath(__file__))


def helper_path(relative: str) -> str:
    """The control-node path of ``files/<relative>`` (``model_snapshot/peer_pull.py``)."""
    return os.path.join(ROOT, relative)


def helper_text(relative: str) -> str:
    """The text of ``files/<relative>``: a program sent with ``sh -c`` or ``python3 -c``."""
    with open(helper_path(relative)) as f:
        return f.read()
