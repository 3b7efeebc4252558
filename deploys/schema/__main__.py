"""`python -m deploys.schema [--update-docs docs/inventory-keys.md]`: the inventory key table of
docs/inventory-keys.md (deploys/schema/readme.py)."""

import sys

from deploys.schema.readme import main

sys.exit(main(sys.argv[1:]))
