"""The precision audit's collector: one audit of one step, as the ``precision`` section.

It runs one `DtypeAudit` (``collectors/dtype_audit.py``: what each op ran in, and why) on the
step ``DiagnoseConfig.precision_step``.
"""

from __future__ import annotations

import time
from typing import Any, cast

import torch

from ampdiag.compat import autocast as ac
from ampdiag.compat.modules import uncompiled
from ampdiag.schema import PrecisionSection
from ampdiag.sources.live import exclusive, global_hooks
from ampdiag.sources.live.collectors import COLLECTORS
from ampdiag.sources.live.collectors.base import Collector, RunContext
from ampdiag.sources.live.collectors.dtype_audit import DtypeAudit
from ampdiag.sources.live.collectors.module_tracker import ROOT


@COLLECTORS.register
class PrecisionCollector(Collector):
    """Audits the dtype of every op of one step (``precision_step``), forward and backward."""

    name = "precision"
    enabled_by = "precision"

    def __init__(self) -> None:
        self._run: RunContext | None = None
        self._audit: DtypeAudit | None = None
        self._handles: list[Any] = []
        self._done = False
        self._step: int | None = None
        self._result: dict[str, Any] | None = None
        self._error: str | None = None
        self._busy: str | None = None
        self._wall_s = 0.0
        self._t0 = 0.0

    def start(self, run: RunContext) -> None:
        """Remembers the run."""
        self._run = run

    def on_model(self, run: RunContext, model: torch.nn.Module) -> None:
        """Hooks the root model's forward: the audit starts at its first forward of the step."""
        if not run.config.precision:
            return
        if uncompiled(model)[1]:
            # Its ops run as compiled kernels; a dispatch mode around them makes torch.compile
            # run them otherwise (other bits than without the audit, measured under inductor).
            self._done = True
            run.warn("the precision audit did not run: the model is torch.compile'd")
            return
        names = {id(m): (n or ROOT) for n, m in model.named_modules()}

        def pre(module: torch.nn.Module, args: Any) -> None:
            # a forward under no_grad or inference_mode (generation, an eval loop inside the
            # step) is not a training forward: it neither starts the audit nor is audited
            self._root_forward(module, args, names, torch.is_grad_enabled())

        self._handles.append(global_hooks.on_module(model, global_hooks.MODULE_PRE, pre))

    def _root_forward(
        self, module: torch.nn.Module, args: Any, names: dict[int, str], training: bool
    ) -> None:
        run = self._run
        if run is None or not run.on_block_thread():
            return
        if self._audit is not None:
            self._audit.training = training
            if training:
                self._audit.new_forward()
            return
        if self._done or run.window_step() != run.config.precision_step or not training:
            return
        if not exclusive.claim(exclusive.DISPATCH_MODE, self):
            self._done = True
            self._busy = f"another diagnose() block was auditing at step {run.step}"
            run.warn(f"the precision audit did not run: {self._busy}")
            return
        fallback = {d: torch.is_autocast_enabled(d) for d in ("cpu", "cuda")}
        self._step = run.step
        self._t0 = time.perf_counter()
        self._audit = DtypeAudit(names, fallback)
        try:
            self._audit.enter(module, args)
        except Exception:
            self._audit.exit()
            self._audit = None
            self._done = True
            exclusive.release(exclusive.DISPATCH_MODE, self)
            raise

    def _finish(self) -> None:
        audit, self._audit = self._audit, None
        if audit is None:
            return
        self._done = True
        try:
            audit.exit()
        finally:
            exclusive.release(exclusive.DISPATCH_MODE, self)
            self._wall_s = time.perf_counter() - self._t0
            ops = list(audit.rows.values())
            if self._run is not None and self._step is not None:
                counted = sum(int(r["count"]) for r in ops) + int(audit.other["count"])
                self._run.audited_ops = (self._step, counted)
            self._result = {
                "ops": ops,
                "autocast_dtypes": audit.autocast_dtypes,
                "after_backward_ops": audit.other,
                "reenabled_autocast_ops": sorted(audit.reenabled),
                "sdpa": audit.sdpa.rows(),
                "errors": audit.errors,
            }

    def before_optimizer_step(self, run: RunContext, optimizer: torch.optim.Optimizer) -> None:
        """Ends the audit: forward and backward are done."""
        self._finish()

    def on_step_end(self, run: RunContext, step: int) -> None:
        """Ends the audit where no optimizer step came (``d.step()``)."""
        self._finish()

    def stop(self, run: RunContext) -> None:
        """Leaves the mode and removes every hook and patch."""
        try:
            self._finish()
        finally:
            for h in self._handles:
                h.remove()
            self._handles.clear()

    def section(self) -> PrecisionSection | None:
        """The audit's records, or why there are none."""
        run = self._run
        if run is None or not run.config.precision:
            return None
        policy, source = ac.cuda_policy()
        base: PrecisionSection = {
            "audited": self._result is not None,
            "step": self._step,
            "device_type": run.device_type,
            "entry_state": "dispatcher-snapshot" if ac.snapshot_available() else "forward",
            "cuda_policy_source": source,
            "cuda_policy_ops": len(policy),
            "audit_wall_s": round(self._wall_s, 6),
        }
        if self._result is None and self._busy is not None:
            base["not_audited_reason"] = self._busy
            return base
        if self._result is None:
            base["not_audited_reason"] = (
                f"the run ended before step {run.first_step + run.config.precision_step} "
                "(set diagnose(precision_step=0) to audit the first step)"
            )
            return base
        # the audit's records are `PrecisionSection` keys (checked by the contract test)
        return cast("PrecisionSection", {**base, **self._result})
