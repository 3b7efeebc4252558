"""Facts about the model snapshot: the verifier's verdict on the node, free disk where it goes."""

from __future__ import annotations

import json
import shlex
from typing import Any

from pyinfra.api import FactBase
from pyinfra.api.exceptions import FactProcessError


class ModelVerification(FactBase[dict]):
    """Run the node's verifier (stamp fast path unless ``full``) and return its JSON verdict.

    ``{"ok": False, "not_installed": True}`` until the verifier and manifest are on the node.
    """

    default = dict

    def command(self, verifier: str, manifest: str, snapshot_dir: str, stamp: str, full: bool = False) -> str:
        v, m, d, s = (shlex.quote(x) for x in (verifier, manifest, snapshot_dir, stamp))
        flags = " --full" if full else ""
        return (
            f"if [ -f {v} ] && [ -f {m} ]; then python3 {v} {m} {d} --stamp {s} --json --quiet{flags}; "
            f"[ $? -le 1 ]; else echo '{{\"ok\": false, \"not_installed\": true}}'; fi"
        )

    def process(self, output: list[str]) -> dict[str, Any]:
        try:
            return json.loads(output[-1])
        except (IndexError, ValueError) as e:
            raise FactProcessError(f"ModelVerification: unexpected verifier output {output[-3:]!r}") from e


class FreeBytes(FactBase[int]):
    """Bytes available at ``path`` (or at its nearest existing parent)."""

    default = int

    def command(self, path: str) -> str:
        return (f"p={shlex.quote(path)}; while [ ! -e \"$p\" ]; do p=$(dirname \"$p\"); done; "
                "df -P -B1 \"$p\" | awk 'NR==2 {print $4}'")

    def process(self, output: list[str]) -> int:
        try:
            return int(output[0])
        except (IndexError, ValueError) as e:
            raise FactProcessError(f"FreeBytes: unexpected df output {output!r}") from e
