"""`python -m deploys.schema [--update-readme README.md]`: the README key table (deploys/schema/readme.py)."""

import sys

from deploys.schema.readme import main

sys.exit(main(sys.argv[1:]))
