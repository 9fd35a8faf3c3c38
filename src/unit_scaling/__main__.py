"""``python -m unit_scaling``: see :mod:`unit_scaling.app.cli`."""

import sys

from .app.cli import main

sys.exit(main())
