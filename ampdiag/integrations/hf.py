"""Hugging Face ``transformers.Trainer``: diagnose a window of its steps from a callback.

    from ampdiag.integrations.hf import DiagnoseCallback

    trainer = Trainer(..., callbacks=[DiagnoseCallback(steps=(5000, 5020), out="reports/w")])
    trainer.train()  # steps 5000..5019 diagnosed; reports/w/report.html written at step 5020

Steps are the Trainer's optimizer updates: step ``i`` is the one that takes
``state.global_step`` from ``i`` to ``i + 1`` (a resumed run keeps its numbering). The window's
diagnosis opens at ``on_step_begin`` of its first step and closes at ``on_step_end`` of its
last, where the session and report are written; the model, optimizer and GradScaler are the
ones the Trainer runs (Accelerate's wrappers included), found as they run. The Trainer has no
callback for an exception: a run that raises inside the window keeps its diagnosis open until
the next ``train()`` with this callback begins, the callback is closed (`close`), or the
interpreter exits (then with the uncaught error: ``status: error``).
"""

from __future__ import annotations

from typing import Any

from transformers import TrainerCallback

from ampdiag.integrations.window_callback import WindowCallback
from ampdiag.session import Session


class DiagnoseCallback(WindowCallback, TrainerCallback):
    """A ``TrainerCallback`` that diagnoses the steps named (``steps``, or a ``trigger``).

    Takes the arguments of `WindowCallback`: ``steps``, ``trigger``, ``out``, ``config`` and
    any other `DiagnoseConfig` field.
    """

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """The run starts at ``state.global_step`` (a trigger starts watching the loss)."""
        self.window.begin(state.global_step)

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """Step ``state.global_step`` begins: the window may open."""
        self.window.step_begin(state.global_step)

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """Its update done (``global_step`` counted it): the window may close."""
        self.window.step_end(state.global_step - 1)

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """Closes what is open and removes everything (an unreached window: a session)."""
        self.window.end()

    def close(self) -> Session | None:
        """Closes a diagnosis left open (a run that raised): its session is written."""
        return self.window.end()
