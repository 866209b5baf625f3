"""``python -m ampdiag``: the same as the ``ampdiag`` command."""

import sys

from ampdiag.cli import main

sys.exit(main())
