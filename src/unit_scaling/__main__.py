"""``python -m unit_scaling``: see :mod:`unit_scaling.cli`."""

import sys

from .cli import main

sys.exit(main())
