"""Memory analysis: where the bytes go, the CUDA snapshot, and what-if estimates.

Pure modules (no torch at import): `timeline` (categorised timelines, peak, the fallback
categorisation from a Kineto trace), `snapshot` (summaries of CUDA allocator snapshots),
`estimates` (what-if arithmetic). `probe` (``ampdiag.memory_probe``) needs torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ampdiag.memory.probe import memory_probe

__all__ = ["memory_probe"]


def __getattr__(name: str) -> Any:
    if name == "memory_probe":
        from ampdiag.memory.probe import memory_probe

        return memory_probe
    raise AttributeError(f"module 'ampdiag.memory' has no attribute {name!r}")
