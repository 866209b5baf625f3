"""Gradient accumulation: is every micro-batch's gradient kept, and are their losses averaged?

On sampled steps with two or more backward passes, on the model's first trainable parameter
(every backward reaches it); the findings are in docs/how-it-works.md (Gradient accumulation).

* **Zeroing** (`grad-accumulation-broken`): a tensor hook on that parameter sees each
  micro-batch's gradient *before* it is added to ``.grad``; from the second backward on, a
  ``.grad`` that is None, or all zero after a nonzero one, was reset.
* **Loss weight** (`accumulation-loss-not-averaged`): the graph behind the backpropagated
  tensor is walked through scalar arithmetic (``/ N``, ``* w``, ``+``, casts, GradScaler's
  ``* scale``) down to the node that made the loss; hooks on both give d(root)/d(loss), over
  the scale: the weight ``f``, about 1/N averaged, 1 summed. ``grad_norm_ratio`` =
  ``f * |G_N| / |g_1|`` (accumulated over the first micro-batch's unweighted gradient) also
  depends on how aligned the micro-batches are, which the weights do not.

A step with several backward passes but one forward (several losses of one batch) is not
accumulation: the forward calls are recorded and the rules skip it. Everything stays on the
device until the step ends; the hooks return None.
"""

from __future__ import annotations

from typing import Any

import torch

from ampdiag.compat import scaler as compat_scaler
from ampdiag.schema import AccumulationSection
from ampdiag.sources.live import global_hooks
from ampdiag.sources.live.collectors import COLLECTORS
from ampdiag.sources.live.collectors.base import Collector, RunContext, internal_work
from ampdiag.sources.live.discovery import reference_parameter

#: Autograd nodes of scalar arithmetic between a loss and the tensor passed to backward.
ARITHMETIC = frozenset(
    {
        "DivBackward0",
        "DivBackward1",
        "MulBackward0",
        "MulBackward1",
        "NegBackward0",
        "AddBackward0",
        "AddBackward1",
        "SubBackward0",
        "SubBackward1",
        "RsubBackward1",
        "ToCopyBackward0",
        "CloneBackward0",
        "AliasBackward0",
        "ViewBackward0",
        "SqueezeBackward0",
    }
)
MAX_ARITHMETIC_NODES = 16


def _norm(grad: torch.Tensor) -> torch.Tensor:
    """The L2 norm of a gradient, dense or sparse (``nn.Embedding(sparse=True)``).

    ``vector_norm`` has no sparse kernel; a sparse COO gradient may also hold one index
    several times (uncoalesced), so its values are summed per index first, on a copy.
    """
    grad = grad.detach()
    if grad.layout == torch.sparse_coo:
        grad = grad.coalesce().values()
    elif grad.layout != torch.strided:
        grad = grad.values()
    norm: torch.Tensor = torch.linalg.vector_norm(grad.float())
    return norm


class _Micro:
    """What one backward pass of a sampled step left on the device."""

    __slots__ = ("after", "before", "before_none", "grad_loss", "grad_root", "incoming", "scale")

    def __init__(self) -> None:
        self.grad_root: torch.Tensor | None = None
        self.grad_loss: list[torch.Tensor] = []
        self.scale: torch.Tensor | None = None
        self.incoming: torch.Tensor | None = None
        self.before: torch.Tensor | None = None
        self.before_none = False
        self.after: torch.Tensor | None = None


@COLLECTORS.register
class AccumulationCollector(Collector):
    """Zeroing between micro-batches and the micro-batches' loss weights, on sampled steps."""

    name = "accumulation"
    enabled_by = "numerics"

    def __init__(self) -> None:
        self._run: RunContext | None = None
        self._reference: torch.Tensor | None = None
        self._handles: list[Any] = []
        self._node_handles: list[Any] = []
        self._micro: list[_Micro] = []
        self._pending: _Micro | None = None
        self._steps: list[dict[str, Any]] = []
        self._forwards = 0  # of the model, in the step in progress
        self._errors: list[str] = []

    def start(self, run: RunContext) -> None:
        """Remembers the run (the schedule and the scaler)."""
        self._run = run

    def on_model(self, run: RunContext, model: torch.nn.Module) -> None:
        """Hooks the first model's reference parameter (observe only: the hook returns None)."""
        if self._reference is not None:
            return
        self._reference = reference_parameter(model)
        self._handles.append(
            global_hooks.on_module(model, global_hooks.MODULE_PRE, self._count_forward)
        )
        if id(model) in run.found_in_forward:
            # found on its first forward, which began before this hook: the step's first
            # micro-batch counts too (2 micro-batches read 1 forward)
            self._forwards += 1
        if self._reference is not None:
            hook = self._reference.register_hook(self._incoming)  # type: ignore[no-untyped-call]
            self._handles.append(hook)

    def _count_forward(self, module: torch.nn.Module, args: Any) -> None:
        self._forwards += 1

    def _current(self) -> _Micro:
        if self._pending is None:
            self._pending = _Micro()
        return self._pending

    def before_backward(self, run: RunContext, tensor: torch.Tensor) -> None:
        """On sampled steps, hooks the root and the loss node of the coming backward."""
        if not run.is_sampled() or tensor.grad_fn is None or tensor.numel() != 1:
            return
        micro = self._current()
        root, losses = _loss_nodes(tensor.grad_fn)
        if not losses:
            return

        def keep_root(grad_outputs: Any) -> None:
            if grad_outputs and isinstance(grad_outputs[0], torch.Tensor):
                micro.grad_root = grad_outputs[0].detach()

        def keep_loss(grad_outputs: Any) -> None:
            if grad_outputs and isinstance(grad_outputs[0], torch.Tensor):
                micro.grad_loss.append(grad_outputs[0].detach())

        self._node_handles.append(root.register_prehook(keep_root))
        for node in losses:
            self._node_handles.append(node.register_prehook(keep_loss))
        scaler = run.scaler
        if scaler is not None and compat_scaler.is_enabled(scaler):
            scale = compat_scaler.scale_tensor(scaler)
            if scale is not None:
                with internal_work():
                    micro.scale = scale.detach().clone()

    def _incoming(self, grad: torch.Tensor) -> None:
        run, ref = self._run, self._reference
        if run is None or ref is None or not run.is_sampled():
            return
        micro = self._current()
        with internal_work():
            micro.incoming = _norm(grad)
            if self._micro:  # a previous backward of this step already accumulated
                if ref.grad is None:
                    micro.before_none = True
                else:
                    micro.before = _norm(ref.grad)

    def after_backward(self, run: RunContext, index: int) -> None:
        """Closes the micro-batch: the accumulated gradient's norm after it."""
        if not run.is_sampled() or self._reference is None:
            return
        micro = self._current()
        grad = self._reference.grad
        if grad is not None:
            with internal_work():
                micro.after = _norm(grad)
        self._micro.append(micro)
        self._pending = None

    def on_step_end(self, run: RunContext, step: int) -> None:
        """Reads the step's figures once (sampled steps with two or more micro-batches)."""
        micro, self._micro, self._pending = self._micro, [], None
        forwards, self._forwards = self._forwards, 0
        for handle in self._node_handles:
            handle.remove()
        self._node_handles.clear()
        if len(micro) < 2:
            return
        try:
            self._steps.append({**_step_figures(step, micro), "forwards": forwards})
        except Exception as exc:  # a reading failed: say so, never break the run
            self._errors.append(f"step {step}: {exc!r}")

    def stop(self, run: RunContext) -> None:
        """Removes every hook."""
        for handle in self._handles + self._node_handles:
            handle.remove()
        self._handles.clear()
        self._node_handles.clear()

    def section(self) -> AccumulationSection | None:
        """Per sampled accumulating step: zeroing, loss weights, the norm ratio."""
        if self._run is None:
            return None
        return {"steps": self._steps, "errors": self._errors}


def _loss_nodes(root: Any) -> tuple[Any, list[Any]]:
    """The root node and the first non-arithmetic nodes below it (the losses)."""
    losses: list[Any] = []
    stack, seen = [root], set[int]()
    while stack and len(seen) < MAX_ARITHMETIC_NODES:
        node = stack.pop()
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        if node.name() in ARITHMETIC:
            stack.extend(fn for fn, _ in node.next_functions)
        elif getattr(node, "variable", None) is None:  # not a leaf's AccumulateGrad
            losses.append(node)
    return root, losses


def _value(t: torch.Tensor | None) -> float | None:
    return None if t is None else float(t.detach().float().abs().max().item())


def _step_figures(step: int, micro: list[_Micro]) -> dict[str, Any]:
    zeroed: list[int] = []
    previous_after: float | None = None
    weights: list[float] = []
    for k, m in enumerate(micro):
        before = _value(m.before)
        if k > 0 and (m.before_none or (before == 0.0 and (previous_after or 0.0) > 0.0)):
            zeroed.append(k)
        previous_after = _value(m.after)
        root = _value(m.grad_root)
        loss = max((_value(g) or 0.0 for g in m.grad_loss), default=None)
        scale = _value(m.scale) if m.scale is not None else 1.0
        if root and loss is not None and scale:
            weights.append(loss / root / scale)
    n = len(micro)
    out: dict[str, Any] = {
        "step": step,
        "micro_batches": n,
        "zeroed_before": zeroed,
        "how": ("set_to_none" if any(micro[k].before_none for k in zeroed) else "zeroed")
        if zeroed
        else None,
    }
    if len(weights) == n:
        out["loss_weights"] = [round(w, 6) for w in weights]
        out["loss_weight_sum"] = round(sum(weights), 6)
        first, last = _value(micro[0].incoming), _value(micro[-1].after)
        if first and last is not None and not zeroed:
            out["grad_norm_ratio"] = round(weights[0] * last / first, 4)
    return out
