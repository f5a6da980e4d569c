"""``python -m reflectrl.cli``: the ``reflectrl`` command (how a comparison runs each of its runs)."""

import sys

from reflectrl.cli import main

sys.exit(main())
