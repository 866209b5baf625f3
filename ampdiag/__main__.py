"""``python -m ampdiag``: the same as the ``ampdiag`` command."""

from ampdiag.cli import console_main

console_main()
