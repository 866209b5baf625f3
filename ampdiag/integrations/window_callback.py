"""What every framework's ``DiagnoseCallback`` shares: its arguments and the window it drives.

Each framework's callback is `WindowCallback` plus that framework's callback base, so the
callbacks take (and document) their settings in one place and cannot drift apart; the hooks
that turn the framework's events into window calls stay in the framework's own module. This
module imports no framework.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ampdiag.config import DiagnoseConfig
from ampdiag.session import Session
from ampdiag.sources.live.diagnosis import make_config
from ampdiag.sources.live.loop import LoopWindow


class WindowCallback:
    """A trainer's callback that diagnoses the steps named (``steps``, or a ``trigger``).

    Args:
        steps: ``(A, B)`` or ``range(A, B)``: the steps diagnosed (``DiagnoseConfig.steps``).
        trigger: ``"loss-spike"``: the steps after the loss first spikes
            (``DiagnoseConfig.trigger``). Neither: every step of the run.
        out: The output folder (default: a new ``reports/run-<time>/``).
        config: The settings (default: ``DiagnoseConfig()``).
        **settings: Any other `DiagnoseConfig` field, as for ``diagnose()``.
    """

    def __init__(
        self,
        steps: tuple[int, int] | range | None = None,
        *,
        trigger: str | None = None,
        out: str | Path | None = None,
        config: DiagnoseConfig | None = None,
        **settings: Any,
    ) -> None:
        chosen = make_config(config, {**settings, "steps": steps, "trigger": trigger})
        self.window = LoopWindow(chosen, out)

    @property
    def session(self) -> Session | None:
        """The window's Session, once its diagnosis closed."""
        return self.window.session
