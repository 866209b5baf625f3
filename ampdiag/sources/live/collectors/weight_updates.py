"""Low-precision weights: does the optimizer's update survive in the parameter's own dtype?

A model cast with ``model.to(torch.bfloat16)`` hands the optimizer BF16 or FP16 parameters:
each update is rounded to the weight's own spacing, and one smaller than half of it is lost.
BF16 keeps 8 significant bits, so with a small learning rate most updates of a trained-size
weight round away ("stale weights"); FP32 weights under autocast keep them.

Per optimizer, on sampled steps:

* **Inventory**: the parameters it updates (those with a gradient) stored in BF16 or FP16; a
  frozen BF16 base model beside FP32 adapters is not among them.
* **Rounded-away updates**: before ``optimizer.step()``, for up to `MAX_PARAMS` of those, a
  copy of up to `MAX_ELEMENTS` evenly spaced values and where their gradient is nonzero; after
  the step, the same values again. A value whose gradient was nonzero and that is bit-for-bit
  unchanged lost its update (every torch optimizer moves such an element). A step the
  GradScaler skipped never reaches the hooks; a group with ``lr == 0`` is left out.
* **Master copies**: a parameter whose optimizer state holds a same-shape FP32 (or 16-bit
  integer: the low half of an FP32 master) tensor is updated through it, so it is counted
  apart (``master_params``), not measured.

The copies are taken under `internal_work` and never touch the parameters or gradients.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch

from ampdiag.compat import autograd
from ampdiag.schema import WeightUpdatesSection
from ampdiag.sources.live.collectors import COLLECTORS
from ampdiag.sources.live.collectors.base import Collector, RunContext, internal_work

#: The dtypes a weight loses small updates in.
LOW_PRECISION = (torch.bfloat16, torch.float16)
#: Parameters measured per optimizer step, and values per parameter (evenly spaced).
MAX_PARAMS = 256
MAX_ELEMENTS = 4096
#: Per-step records kept (the totals cover every sampled step).
MAX_STEPS = 200
#: Gradients watched for being cleared between optimizer steps (the smallest ones: a bias).
STALE_WATCHED = 4
#: Parameters named in the section (the largest shares of lost updates first).
TOP_PARAMS = 10
#: Optimizer-state dtypes that hold a master copy of a low-precision weight (or its low bits).
MASTER_DTYPES = (torch.float32, torch.float64, torch.int16, torch.uint16)


def _dense(t: torch.Tensor | None) -> bool:
    """Whether ``t`` is a plain strided tensor (no sparse layout, no DTensor or subclass)."""
    return t is not None and t.layout == torch.strided and type(t) in (torch.Tensor,)


def _sample(flat: torch.Tensor) -> torch.Tensor:
    """Up to `MAX_ELEMENTS` values of a flat tensor, evenly spaced (a copy)."""
    n = flat.numel()
    if n <= MAX_ELEMENTS:
        return flat.clone()
    stride = n // MAX_ELEMENTS
    return flat[: stride * MAX_ELEMENTS : stride].clone()


def _flat(p: torch.Tensor) -> torch.Tensor:
    return p.detach().reshape(-1)


def has_master(optimizer: torch.optim.Optimizer, p: torch.Tensor) -> bool:
    """Whether the optimizer's state for ``p`` holds a same-shape master copy (see module)."""
    state = optimizer.state.get(p)
    if not isinstance(state, dict) or p.numel() < 2:
        return False
    return any(
        isinstance(v, torch.Tensor) and v.dtype in MASTER_DTYPES and v.shape == p.shape
        for v in state.values()
    )


class _Pending:
    """One optimizer step's copies: (parameter, values before, nonzero-gradient flags)."""

    __slots__ = ("entries", "step")

    def __init__(self, step: int) -> None:
        self.step = step
        self.entries: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []


@COLLECTORS.register
class WeightUpdatesCollector(Collector):
    """BF16/FP16 parameters an optimizer updates, and the share of their updates lost."""

    name = "weight_updates"
    enabled_by = "numerics"

    def __init__(self) -> None:
        self._run: RunContext | None = None
        self._names: dict[int, str] = {}
        self._named = 0  # models whose parameter names are in _names
        self._optimizers: dict[int, dict[str, Any]] = {}  # id -> inventory row
        self._pending: dict[int, _Pending] = {}
        self._steps: list[dict[str, Any]] = []
        self._params: dict[int, dict[str, Any]] = {}  # id(p) -> per-parameter totals
        self._totals = {"elements": 0, "unchanged": 0, "steps": 0}
        self._masters: dict[int, set[int]] = {}  # optimizer id -> ids of params with a master
        # optimizer id -> id(p) -> (name, dtype, numel) of the low-precision params it updates
        self._updated: dict[int, dict[int, tuple[str, str, int]]] = {}
        # gradients never cleared: (param, its gradient after the step, its version then)
        self._stale_watch: list[tuple[torch.Tensor, torch.Tensor, int]] = []
        self._stale = {"checked": 0, "not_cleared": 0}
        self._stale_steps: list[int] = []

    def start(self, run: RunContext) -> None:
        """Remembers the run (its schedule and models)."""
        self._run = run

    def _name(self, p: torch.Tensor) -> str:
        """The parameter's name in the models (their parameters are read once per new model)."""
        run = self._run
        if id(p) not in self._names and run is not None and self._named < len(run.models):
            for model in run.models[self._named :]:
                for n, q in model.named_parameters():
                    self._names.setdefault(id(q), n)
            self._named = len(run.models)
        return self._names.get(id(p), f"{tuple(p.shape)} {str(p.dtype).replace('torch.', '')}")

    def _low(self, optimizer: torch.optim.Optimizer) -> Iterator[tuple[dict[str, Any], Any]]:
        """The optimizer's low-precision parameters, with their group."""
        for group in getattr(optimizer, "param_groups", []):
            for p in group.get("params", []):
                if isinstance(p, torch.Tensor) and p.dtype in LOW_PRECISION:
                    yield group, p

    def _inventory(self, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
        key = id(optimizer)
        row = self._optimizers.get(key)
        if row is None:
            groups = getattr(optimizer, "param_groups", [])
            lrs = {g.get("lr") for g in groups}
            row = self._optimizers[key] = {
                "optimizer": type(optimizer).__name__,
                "params": sum(len(g.get("params", [])) for g in groups),
                "low_precision_in_optimizer": sum(1 for _ in self._low(optimizer)),
                "lr": sorted(float(lr) for lr in lrs if isinstance(lr, (int, float))),
                # Adam's epsilon (what FP16 state rounds it to decides a 0/0: `weights` rule)
                "eps": sorted(
                    {float(e) for g in groups if isinstance(e := g.get("eps"), (int, float))}
                ),
                "master_params": 0,
            }
            self._updated[key] = {}
        return row

    def _note_updated(self, optimizer: torch.optim.Optimizer, p: torch.Tensor) -> None:
        """Counts ``p`` among the low-precision parameters the optimizer updates."""
        seen = self._updated[id(optimizer)]
        if id(p) not in seen:
            seen[id(p)] = (self._name(p), str(p.dtype).replace("torch.", ""), p.numel())

    def before_backward(self, run: RunContext, tensor: torch.Tensor) -> None:
        """At the first backward after an optimizer step: were the gradients cleared?

        A gradient the step left that is still the same tensor, with no in-place change since
        (its version counter unchanged: ``zero_()`` bumps it, ``zero_grad()`` sets it to None),
        is about to have this backward's gradient added to it: the next update applies the
        sum of every earlier step's gradients. Python-only checks of a few small parameters
        (no device work, no read).
        """
        watch, self._stale_watch = self._stale_watch, []
        if not watch or not run.on_block_thread():
            return
        self._stale["checked"] += 1
        if all(p.grad is g and autograd.version(g) == v for p, g, v in watch):
            self._stale["not_cleared"] += 1
            if len(self._stale_steps) < MAX_STEPS:
                self._stale_steps.append(run.step)

    def _watch_gradients(self, optimizer: torch.optim.Optimizer) -> None:
        """Keeps the smallest gradients the step used (a few), to see whether they get cleared."""
        grads = [
            p
            for group in getattr(optimizer, "param_groups", [])
            for p in group.get("params", [])
            if isinstance(p, torch.Tensor) and isinstance(p.grad, torch.Tensor)
        ]
        if len(self._optimizers) > 1:
            # several optimizers (a GAN's two): one's backward legitimately adds to the other's
            # gradients before that one clears them -- not told apart here
            self._stale_watch = []
            return
        grads.sort(key=lambda p: p.numel())
        self._stale_watch = [
            (p, p.grad, autograd.version(p.grad))
            for p in grads[:STALE_WATCHED]
            if p.grad is not None
        ]

    def before_optimizer_step(self, run: RunContext, optimizer: torch.optim.Optimizer) -> None:
        """On sampled steps, copies a sample of each low-precision parameter and its gradient.

        A parameter counts as updated when it has a gradient on a sampled step (a frozen
        BF16 base model beside FP32 adapters is not one the optimizer updates).
        """
        row = self._inventory(optimizer)
        if not row["low_precision_in_optimizer"] or not run.is_sampled():
            return
        masters = self._masters.get(id(optimizer), set())
        chosen = []
        for group, p in self._low(optimizer):
            lr = group.get("lr")
            if p.grad is None or (isinstance(lr, (int, float)) and lr == 0):
                continue  # not updated: no gradient, or a learning rate of 0 by design
            self._note_updated(optimizer, p)
            if id(p) not in masters and _dense(p.grad) and _dense(p.data):
                chosen.append(p)
        if len(chosen) > MAX_PARAMS:  # spread over the model, not its first layers only
            stride = len(chosen) / MAX_PARAMS
            chosen = [chosen[int(i * stride)] for i in range(MAX_PARAMS)]
        pending = _Pending(run.step)
        with internal_work(), torch.no_grad():
            for p in chosen:
                grad = p.grad
                assert grad is not None
                if grad.shape != p.shape:
                    continue
                pending.entries.append((p, _sample(_flat(p)), _sample(_flat(grad)) != 0))
        if pending.entries:
            self._pending[id(optimizer)] = pending

    def after_optimizer_step(self, run: RunContext, optimizer: torch.optim.Optimizer) -> None:
        """Compares the copies with the stored values after the step (one host read)."""
        try:
            self._watch_gradients(optimizer)
        except Exception:  # a refinement: never the user's problem
            self._stale_watch = []
        pending = self._pending.pop(id(optimizer), None)
        if pending is None:
            return
        row = self._optimizers[id(optimizer)]
        masters = self._masters.setdefault(id(optimizer), set())
        kept: list[tuple[torch.Tensor, torch.Tensor]] = []
        counts = []
        with internal_work(), torch.no_grad():
            for p, before, moving in pending.entries:
                if has_master(optimizer, p):
                    masters.add(id(p))
                    continue
                after = _sample(_flat(p))
                if after.shape != before.shape:
                    continue
                unchanged = moving & (after == before)
                counts.append(torch.stack([moving.sum(), unchanged.sum()]))
                kept.append((p, before))
            row["master_params"] = len(masters)
            if not counts:
                return
            values = torch.stack(counts).cpu().tolist()  # the step's one host read
        elements = unchanged_total = 0
        for (p, _), (m, u) in zip(kept, values, strict=True):
            elements += int(m)
            unchanged_total += int(u)
            per = self._params.get(id(p))
            if per is None:
                per = self._params[id(p)] = {
                    "name": self._name(p),
                    "dtype": str(p.dtype).replace("torch.", ""),
                    "numel": p.numel(),
                    "elements": 0,
                    "unchanged": 0,
                }
            per["elements"] += int(m)
            per["unchanged"] += int(u)
        self._totals["elements"] += elements
        self._totals["unchanged"] += unchanged_total
        self._totals["steps"] += 1
        if len(self._steps) < MAX_STEPS:
            self._steps.append(
                {
                    "step": pending.step,
                    "optimizer": row["optimizer"],
                    "params": len(kept),
                    "elements": elements,
                    "unchanged": unchanged_total,
                    "unchanged_share": round(unchanged_total / elements, 6) if elements else None,
                }
            )

    def stop(self, run: RunContext) -> None:
        """Drops the copies of a step that never finished (nothing is hooked here)."""
        self._pending.clear()
        self._stale_watch = []

    def section(self) -> WeightUpdatesSection | None:
        """The low-precision parameters per optimizer, and the share of their updates lost."""
        if self._run is None or not self._optimizers:
            return None
        elements, unchanged = self._totals["elements"], self._totals["unchanged"]
        params = sorted(
            self._params.values(),
            key=lambda r: (-(r["unchanged"] / r["elements"]) if r["elements"] else 0.0, r["name"]),
        )
        optimizers = []
        for key, row in self._optimizers.items():
            updated = list(self._updated.get(key, {}).values())
            dtypes: dict[str, int] = {}
            for _, dtype, _ in updated:
                dtypes[dtype] = dtypes.get(dtype, 0) + 1
            optimizers.append(
                {
                    **row,
                    "low_precision_params": len(updated),
                    "low_precision_numel": sum(n for _, _, n in updated),
                    "dtypes": dtypes,
                    "examples": [name for name, _, _ in updated[:5]],
                }
            )
        return {
            "optimizers": optimizers,
            # backwards that began with the last step's gradients never cleared, of those checked
            "grads_not_cleared": dict(self._stale) | {"steps": self._stale_steps[:20]},
            "steps": self._steps,
            "steps_measured": self._totals["steps"],
            "elements": elements,
            "unchanged": unchanged,
            "unchanged_share": round(unchanged / elements, 6) if elements else None,
            "params": [
                {**r, "unchanged_share": round(r["unchanged"] / r["elements"], 6)}
                for r in params[:TOP_PARAMS]
                if r["elements"]
            ],
            "max_elements_per_param": MAX_ELEMENTS,
        }
