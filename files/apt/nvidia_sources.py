"""The apt entries besides the toolkit's own that name its NVIDIA repos, found and disabled one by one (stdlib only:
sent to the node with `python3 -c`; deploys/apt_sources.py).

    nvidia_sources.py find|disable ETC OWN_FILES URI...     (OWN_FILES: the toolkit's own source files, comma-joined)

Only the entries go, never the file around them: a hand-added CUDA line in `/etc/apt/sources.list` is commented out
(its distribution lines stay), a deb822 stanza (Ubuntu 24.04's `ubuntu.sources` style) gets `Enabled: no`. Each
change carries a marker that says what it was (MARK), and the first change of a file keeps a copy of it beside
(`<file>.inference-nodes-orig`): `find` prints what is enabled and names a URI as JSON; `disable` changes those and
prints what it changed. A deb822 stanza whose URIs mix an NVIDIA repo with others is left alone and reported: a
line of its own for each is the admin's to write.
"""

from __future__ import annotations

import glob
import json
import os
import sys

MARK = "# inference-nodes: disabled (a second apt source for the NVIDIA repo the toolkit's own source names): "
ORIG = ".inference-nodes-orig"


def source_files(etc: str) -> list[str]:
    """In the order apt reads them."""
    files = [os.path.join(etc, "sources.list")]
    files += sorted(glob.glob(os.path.join(etc, "sources.list.d", "*.list")))
    files += sorted(glob.glob(os.path.join(etc, "sources.list.d", "*.sources")))
    return [f for f in files if os.path.isfile(f)]


def names(text: str, uris: list[str]) -> bool:
    return any(u in text for u in uris)


def one_line_entries(lines: list[str], uris: list[str]) -> list[int]:
    """Indexes of the enabled one-line entries (`deb ...`) that name a URI."""
    return [i for i, line in enumerate(lines)
            if line.split("#", 1)[0].strip().startswith(("deb ", "deb-src ", "deb\t")) and names(line.split("#", 1)[0], uris)]


def stanzas(lines: list[str]) -> list[tuple[int, int]]:
    """(first, end) line indexes of each deb822 stanza (blank lines separate them)."""
    out, start = [], None
    for i, line in enumerate([*lines, ""]):
        if line.strip() and start is None:
            start = i
        elif not line.strip() and start is not None:
            out.append((start, i))
            start = None
    return out


def field(lines: list[str], first: int, end: int, name: str) -> tuple[int | None, str]:
    """The line index and value of field ``name`` of a stanza (None, "" when absent; continuation lines joined)."""
    for i in range(first, end):
        line = lines[i]
        if not line.startswith("#") and line.split(":", 1)[0].strip().lower() == name.lower() and ":" in line:
            value = [line.split(":", 1)[1].strip()]
            j = i + 1
            while j < end and lines[j][:1] in (" ", "\t"):
                value.append(lines[j].strip())
                j += 1
            return i, " ".join(value)
    return None, ""


def deb822_entries(lines: list[str], uris: list[str]) -> tuple[list[tuple[int, int]], list[str]]:
    """The enabled stanzas whose URIs all name an NVIDIA repo, and what the mixed ones name (reported)."""
    found, mixed = [], []
    for first, end in stanzas(lines):
        _, listed = field(lines, first, end, "URIs")
        _, enabled = field(lines, first, end, "Enabled")
        words = listed.split()
        if not words or enabled.lower() == "no" or not any(names(w, uris) for w in words):
            continue
        if all(names(w, uris) for w in words):
            found.append((first, end))
        else:
            mixed.append(listed)
    return found, mixed


def scan(path: str, uris: list[str]):
    with open(path, encoding="utf-8") as f:
        lines = f.read().split("\n")
    if path.endswith(".sources"):
        found, mixed = deb822_entries(lines, uris)
        return lines, [("stanza", first, end) for first, end in found], mixed
    return lines, [("line", i, i + 1) for i in one_line_entries(lines, uris)], []


def disabled(lines: list[str], entries: list[tuple[str, int, int]]) -> list[str]:
    out = list(lines)
    for kind, first, end in sorted(entries, key=lambda e: -e[1]):  # from the end: indexes stay valid
        if kind == "line":
            out[first] = MARK + out[first]
            continue
        at, was = field(out, first, end, "Enabled")
        note = f"{MARK}Enabled: {was or '(unset: yes)'}"
        if at is None:
            out[end:end] = ["Enabled: no"]
            out[first:first] = [note]
        else:
            out[at] = "Enabled: no"
            out[first:first] = [note]
    return out


def write(path: str, lines: list[str]) -> None:
    if not os.path.exists(path + ORIG):
        with open(path, "rb") as src, open(path + ORIG, "wb") as dst:
            dst.write(src.read())
    st = os.stat(path)
    tmp = path + ".inference-nodes-tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write("\n".join(lines))
    os.chmod(tmp, st.st_mode & 0o7777)
    os.replace(tmp, path)


def main(argv: list[str]) -> int:
    mode, etc, own, uris = argv[0], argv[1], set(filter(None, argv[2].split(","))), argv[3:]
    report = {"entries": [], "mixed": []}
    for path in source_files(etc):
        if path in own:
            continue
        lines, entries, mixed = scan(path, uris)
        report["entries"] += [f"{path}:{first + 1}" for _, first, _ in entries]
        report["mixed"] += [f"{path}: URIs: {m}" for m in mixed]
        if mode == "disable" and entries:
            write(path, disabled(lines, entries))
    print(json.dumps(report, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
