"""What a secret looks like, so a message can show a bad value without ever showing one: well-known token shapes, any
long random-looking run, and a URL's credentials. The lowest layer of the schema: a component's own rule can ask."""

from __future__ import annotations

import re

# Well-known token shapes (Hugging Face, GitHub, GitLab, OpenAI-style, AWS, Slack, JWT) and any long run of
# mixed-case letters and digits (a random secret) that is not plain hex (commits and digests are shown).
_TOKEN = re.compile(
    r"(hf_|gh[pousr]_|github_pat_|glpat-|sk-|xox[abprs]-)[A-Za-z0-9_-]{12,}|AKIA[0-9A-Z]{16}"
    r"|eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}"
    r"|(?<![A-Za-z0-9+=])(?=[A-Za-z0-9+=]*[a-z])(?=[A-Za-z0-9+=]*[A-Z])(?=[A-Za-z0-9+=]*[0-9])[A-Za-z0-9+=]{32,}"
)
HIDDEN = "<hidden: looks like a secret>"
# `scheme://user:password@host`: the credentials of a URL (shown as `scheme://<hidden>@host`)
URL_CREDENTIALS = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*://)[^/\s@]+@")


def looks_secret(text: str) -> bool:
    return bool(_TOKEN.search(text))
