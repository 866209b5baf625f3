"""The one place private torch APIs are touched, with version guards and fallbacks.

Everything else in ampdiag imports private torch things only from here (one submodule per
concern: ``compat.scaler`` for the GradScaler's private state, ``compat.memory`` for the
memory profiler and CUDA memory history). Each function documents the torch versions it was
checked on and what it returns when the private API is missing or changed.
"""

from __future__ import annotations
