"""``python -m reflectrl`` (and ``torchrun ... -m reflectrl llm train ...``): the ``reflectrl`` command."""

import sys

from reflectrl.cli import main

sys.exit(main())
