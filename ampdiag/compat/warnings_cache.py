"""The warnings module's decision caches: cleared after ampdiag drops filters it added.

``warnings.filterwarnings()`` clears them through the private ``_filters_mutated``; editing
``warnings.filters`` in place does not, so a module would keep acting on a dropped filter.
Where the private function is missing, a ``catch_warnings`` entry and exit clear them too.
"""

from __future__ import annotations

import warnings


def clear_warning_caches() -> None:
    """Makes every module re-read ``warnings.filters`` (as ``filterwarnings()`` does)."""
    mutated = getattr(warnings, "_filters_mutated", None)
    if callable(mutated):
        mutated()
    else:
        with warnings.catch_warnings():
            pass
