"""Facts about the model snapshot: the verifier's verdict on the node."""

from __future__ import annotations

import json
import shlex
from typing import Any

from pyinfra.api import FactBase
from pyinfra.api.exceptions import FactProcessError


class ModelVerification(FactBase[dict]):
    """Run the node's verifier (stamp fast path unless ``full`` or no full re-hash is on record) and return
    its JSON verdict (a full run records its verdict in ``record``).

    ``{"ok": False, "not_installed": True}`` until the verifier and manifest are on the node.
    """

    default = dict

    def command(self, verifier: str, manifest: str, snapshot_dir: str, stamp: str, record: str,
                full: bool = False) -> str:
        v, m, d, s, r = (shlex.quote(x) for x in (verifier, manifest, snapshot_dir, stamp, record))
        # a full re-hash when asked, and on a node that has no record of one (new, or upgraded to the timer)
        flags = " --full" if full else f" $([ -f {r} ] || echo --full)"
        return (
            f"if [ -f {v} ] && [ -f {m} ]; then python3 {v} {m} {d} --stamp {s} --record {r} --json --quiet{flags}; "
            f"[ $? -le 1 ]; else echo '{{\"ok\": false, \"not_installed\": true}}'; fi"
        )

    def process(self, output: list[str]) -> dict[str, Any]:
        try:
            return json.loads(output[-1])
        except (IndexError, ValueError) as e:
            raise FactProcessError(f"ModelVerification: unexpected verifier output {output[-3:]!r}") from e
