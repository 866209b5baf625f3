"""Lightning (``lightning.Trainer``): diagnose a window of its steps from a ``Callback``.

    from ampdiag.integrations.lightning import DiagnoseCallback

    trainer = lightning.Trainer(..., callbacks=[DiagnoseCallback(steps=(5000, 5020))])
    trainer.fit(module, loader)

Steps are the Trainer's optimizer updates: step ``i`` is the one that takes
``trainer.global_step`` from ``i`` to ``i + 1`` (with ``accumulate_grad_batches`` it spans
several batches). The window's diagnosis opens at ``on_train_batch_start`` of its first step
and closes at the ``on_train_batch_end`` where its last step's update is done, writing the
session and report; ``on_exception`` closes it with the run's error. The model, optimizer and
GradScaler are the ones Lightning runs (its precision plugin, its closure optimizer), found
as they run.
"""

from __future__ import annotations

from typing import Any

try:
    from lightning.pytorch.callbacks import Callback
except ImportError:  # the package's older name (its Trainer takes only its own Callback)
    from pytorch_lightning.callbacks import Callback  # type: ignore[assignment, import-not-found, unused-ignore]

from ampdiag.integrations.window_callback import WindowCallback


class DiagnoseCallback(WindowCallback, Callback):
    """A Lightning ``Callback`` that diagnoses the steps named (``steps``, or a ``trigger``).

    Takes the arguments of `WindowCallback`: ``steps``, ``trigger``, ``out``, ``config`` and
    any other `DiagnoseConfig` field.
    """

    _done = 0  # the optimizer updates done at the last batch's end

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        """The run starts at ``trainer.global_step`` (a trigger starts watching the loss)."""
        self._done = trainer.global_step
        self.window.begin(trainer.global_step)

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, idx: int) -> None:
        """A batch of step ``trainer.global_step`` begins: the window may open."""
        self.window.step_begin(trainer.global_step)

    def on_train_batch_end(
        self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, idx: int
    ) -> None:
        """The steps whose update this batch completed ended: the window may close."""
        done = trainer.global_step
        for step in range(self._done, done):  # one update per step (more: several optimizers)
            self.window.step_end(step)
        self._done = done

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        """Closes what is open and removes everything."""
        self.window.end()

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        """The run raised: the open window closes with its error (``status: error``)."""
        self.window.end(exception)
