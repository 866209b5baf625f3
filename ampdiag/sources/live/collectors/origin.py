"""Where a step's first inf/NaN was made, from what the sentinel recorded in that step.

The sentinel (`sentinel.py`) records, per step, every module *call* (a `Call`: its module,
its parent -- the call running when it started, -1 for a root --, its input and output tokens)
and one finiteness token per distinct tensor it saw: the first floating input of each
call (before the module runs) and its first floating output (after). In the backward, one
event per hooked tensor's gradient, with the *roles* that tensor played in the forward: the
input or the output of which calls. A role is ``call * 2 + OUTPUT`` (or ``+ INPUT``); a token
or event is shared by every role of the same tensor (the output of one module is the input of
the next), so the cost is one reduction per distinct tensor.

Forward: the first non-finite token is the origin. When it is a call's output and that call's
input was finite, the call made it: a leaf module's own computation, or -- when children ran
in it, all finite -- its own code after the last of them. When it is a call's input, the value
was non-finite before that module started: it was made in the code of the parent call, after
the previous child that finished (finite) and before this one; a root's input is the model's
input.

Backward: the first non-finite gradient event is the origin. If one of its roles is the input
of a call whose output gradient arrived earlier (finite), that call's backward made it (the
deepest such call; when its children's gradients arrived finite before, its own code before
them). Otherwise the gradient with respect to some call's output is already non-finite: the
code that used that output made it, in the parent call after that child (and before the child
whose backward ran last); a root's output gradient comes from the loss.

Pure functions of the recorded lists: no torch, nothing live.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

#: Role bits: a tensor was a call's input or its output.
INPUT, OUTPUT = 0, 1
#: The pseudo-module named when the loss (forward) or its backward holds the first inf/NaN.
LOSS = "(loss)"


class Call:
    """One module call of the step (or of its replay): forward tokens' positions, -1: none.

    ``module``: the module's index; ``parent``: the call running when it started; ``inp``,
    ``out``: its input's and output's tokens; ``start``: the tokens made before it started
    (-1: its pre-hook never ran).
    """

    __slots__ = ("inp", "module", "out", "parent", "start")

    def __init__(self, module: int, parent: int, start: int) -> None:
        self.module, self.parent, self.start = module, parent, start
        self.inp = self.out = -1


def _depths(calls: Sequence[Call]) -> list[int]:
    depth: list[int] = []
    for c in calls:
        parent = c.parent
        depth.append(depth[parent] + 1 if 0 <= parent < len(depth) else 0)
    return depth


def _origin(phase: str, module: str, kind: str, between: list[str | None] | None) -> dict[str, Any]:
    out: dict[str, Any] = {"phase": phase, "module": module, "kind": kind}
    out["parent_code"] = between is not None
    if between is not None:
        out["between"] = between
    return out


def forward(
    calls: Sequence[Call],
    owners: Sequence[int],
    finite: Sequence[bool],
    names: Sequence[str],
) -> dict[str, Any] | None:
    """The forward origin (phase, module, kind, parent_code[, between]), or None if all finite.

    Args:
        calls: Per call, in the order the calls started.
        owners: Per token, the role (``call * 2 + INPUT/OUTPUT``) whose hook computed it.
        finite: Per token, whether it is finite.
        names: Module index -> name.
    """
    bad = next((i for i, ok in enumerate(finite) if not ok), None)
    if bad is None or bad >= len(owners):
        return None
    call, role = divmod(owners[bad], 2)
    if not 0 <= call < len(calls):
        return None
    here = calls[call]
    if role == OUTPUT:
        # Its children ran one after another before its output, all finite (earlier tokens):
        # with any, the value was made in its own code after the last of them.
        kids = [c for c in calls[call + 1 :] if c.parent == call]
        if not kids:
            return _origin("forward", names[here.module], "output", None)
        return _origin("forward", names[here.module], "own code", [names[kids[-1].module], None])
    parent = here.parent
    if parent < 0:  # the value entered the model already non-finite
        return _origin("forward", names[here.module], "input", None)
    prev = [c for c in calls[parent + 1 : call] if c.parent == parent]
    before = names[prev[-1].module] if prev else None
    return _origin("forward", names[calls[parent].module], "own code", [before, names[here.module]])


def backward(
    calls: Sequence[Call],
    roles: Sequence[Sequence[int]],
    finite: Sequence[bool],
    names: Sequence[str],
) -> dict[str, Any] | None:
    """The backward origin (phase, module, kind, parent_code[, between]), or None if finite.

    Args:
        calls: As for `forward`.
        roles: Per gradient event (in backward order), the roles of its tensor.
        finite: Per event, whether the gradient is finite.
        names: Module index -> name.
    """
    bad = next((i for i, ok in enumerate(finite) if not ok), None)
    if bad is None or bad >= len(roles):
        return None
    depth = _depths(calls)
    here = [r for r in roles[bad] if 0 <= r // 2 < len(calls)]
    arrived: set[int] = set()  # calls whose output gradient arrived (finite) before
    last_event: dict[int, int] = {}  # call -> its latest event before ``bad``
    for i in range(bad):
        for r in roles[i]:
            call, role = divmod(r, 2)
            last_event[call] = i
            if role == OUTPUT:
                arrived.add(call)
    made = [r // 2 for r in here if r % 2 == INPUT and r // 2 in arrived]
    if made:
        call = max(made, key=lambda c: depth[c])
        kids = [c for c in last_event if 0 <= c < len(calls) and calls[c].parent == call]
        between = None
        if kids:  # its children's gradients came back finite: its own code before them
            between = [None, names[calls[max(kids, key=lambda c: last_event[c])].module]]
        kind = "own code" if between else "input gradient"
        return _origin("backward", names[calls[call].module], kind, between)
    outs = [r // 2 for r in here if r % 2 == OUTPUT]
    if outs:
        child = min(outs, key=lambda c: depth[c])  # the outermost call returning this tensor
        parent = calls[child].parent
        if parent < 0:
            return _origin("backward", LOSS, "gradient from the loss", None)
        after = [c for c in last_event if 0 <= c < len(calls) and calls[c].parent == parent]
        nxt = names[calls[max(after, key=lambda c: last_event[c])].module] if after else None
        between = [names[calls[child].module], nxt]
        return _origin("backward", names[calls[parent].module], "own code", between)
    ins = [r // 2 for r in here]
    if not ins:
        return None
    call = max(ins, key=lambda c: depth[c])
    return _origin("backward", names[calls[call].module], "input gradient", None)
