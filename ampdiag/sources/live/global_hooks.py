"""torch's global module and optimizer hooks, shared by every active diagnose() block.

torch keeps its global hooks in plain dicts that it iterates on every forward and optimizer
step, in whatever thread runs them. A block in one thread that adds or removes a hook while
another thread iterates the same dict makes that thread's training fail ("OrderedDict mutated
during iteration"). So ampdiag registers one hook of each kind with torch, the first time a
block needs it, and keeps it until no block is left; blocks add and remove their callbacks in
ampdiag's own list (a tuple replaced under a lock, safe to iterate from any thread).

**No hook on the user's modules.** A hook registered on a module lives in the module's own
dicts: ``copy.deepcopy(model)`` (EMA, ``AveragedModel``, best-model copies) and
``torch.save(model)`` then copy or pickle ampdiag's closures with it (and fail on what they
hold), and ``nn.TransformerEncoder`` turns its eval fast path off when any of its modules has
a forward hook (different numbers). So callbacks meant for one module (`on_module`) are kept
here, keyed by the module's id, and called from torch's global hooks, which neither copies,
pickling nor the fast path look at.

**A root model's forwards without torch's global hooks.** While any global module hook is
registered, torch sends every module's call down its slow path (a few microseconds each, and
~0.5 ms on a 30 ms step of a small transformer), so what is watched on every step -- the root
model's forwards (`on_root`) -- is seen by patching the root's *class* ``__call__`` instead (a
wrapper that passes every other instance straight through; restored exactly, like the other
patches), and torch's global module hooks are registered only while some callback needs every
module (the first step's discovery, a sampled step's statistics). Once a forward ran inside
torch.compile they stay registered until the last block ends: dynamo guards on their number,
so adding and removing them between steps would recompile the user's model.

**Training forwards only.** Module callbacks see the forwards that build an autograd graph
outside a backward pass: not ``no_grad``/``inference_mode`` forwards (evaluation, generation
inside the step), not the submodules that activation checkpointing recomputes during the
backward, and not what ``torch.compile`` traces (a Python callback there is a graph break, and
what it would see is a fake tensor); `compiled_region_seen` says a compiled region was skipped.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from functools import partial
from typing import Any

import torch
from torch.nn.modules import module as nn_module
from torch.optim import optimizer as optim_module

from ampdiag.compat.autocast import in_backward
from ampdiag.compat.hooks import any_global_module_hook, register_global_forward_hook
from ampdiag.sources.live.shielding import hide_warning, unhide_warning

MODULE_PRE, MODULE_POST, OPTIMIZER_PRE, OPTIMIZER_POST = (
    "module_pre",
    "module_post",
    "optimizer_pre",
    "optimizer_post",
)
# Per-module only: (module, args, kwargs) after the forward (torch has no global pre-hook
# with keyword arguments; the input objects are the same ones the forward got).
MODULE_INPUTS = "module_inputs"
# Per-module only: (module, args, kwargs, output) after the forward: what a module got by
# keyword (a Hugging Face ``attn(hidden_states=h)``) and what it returned, in one call.
MODULE_POST_KWARGS = "module_post_kwargs"

_LOCK = threading.Lock()
_blocks = 0
_threads: list[int] = []  # the threads of the blocks counted in
# Set (a list item, which dynamo replays as a plain side effect) when a module forward ran
# inside a region torch.compile traced: the callbacks did not see it.
_COMPILED: list[bool] = [False]


_is_compiling = torch.compiler.is_compiling
_grad_enabled = torch.is_grad_enabled


def training_forward() -> bool:
    """Whether a module forward now is one the callbacks observe (see the module doc)."""
    if _is_compiling():
        _COMPILED[0] = True
        return False
    return _grad_enabled() and not in_backward()


def _compiling() -> bool:
    """Whether torch.compile traces now (noted for `compiled_region_seen`).

    Asked before anything else is read: what a hook reads while dynamo traces it becomes a
    guard of the compiled graph (a table of callbacks that changes: a recompilation).
    """
    if _is_compiling():
        _COMPILED[0] = True
        return True
    return False


def compiled_region_seen() -> bool:
    """Whether a forward ran inside a torch.compile region since `reset_compiled_region`."""
    return _COMPILED[0]


def reset_compiled_region() -> None:
    """Forgets `compiled_region_seen` (at a block's start)."""
    _COMPILED[0] = False


class _Shared:
    """One hook registered with torch, calling every block's callbacks of its kind."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.callbacks: tuple[Callable[..., Any], ...] = ()
        # id(module) -> callbacks for that module alone (MODULE_PRE / MODULE_POST).
        self.by_module: dict[int, tuple[Callable[..., Any], ...]] = {}
        self.inputs: dict[int, tuple[Callable[..., Any], ...]] = {}  # MODULE_POST only
        self.with_kwargs: dict[int, tuple[Callable[..., Any], ...]] = {}  # MODULE_POST only
        self.handle: Any = None
        # Optimizer hooks in progress: torch iterates its hooks' dict around the call, and a
        # callback may end a block (a window of steps closing at its last step): removing
        # torch's hook then breaks the user's optimizer.step ("dictionary changed size during
        # iteration"), so the removal waits (`pending`) until the next add or block end.
        self.calling = 0
        self.pending = False

    def call(self, *args: Any) -> None:
        self.calling += 1
        try:
            for callback in self.callbacks:
                callback(*args)
        finally:
            self.calling -= 1

    def call_pre(self, module: Any, args: Any) -> None:
        if _compiling():
            return
        # Read first: a module's callbacks added by a callback below (a model just found)
        # start with its next forward, as a hook registered on the module would.
        own = self.by_module.get(id(module), ())
        if not (own or self.callbacks):  # nothing to call: every module's forward pays this
            return
        if not training_forward():
            return
        for callback in self.callbacks:
            callback(module, args)
        for callback in own:
            callback(module, args)

    def call_post(self, module: Any, args: Any, *rest: Any) -> None:
        # (kwargs, output); torch passes (output) alone when the forward raised (always_call).
        kwargs, output = rest if len(rest) == 2 else ({}, rest[0])
        if _compiling():
            return
        key = id(module)
        own = self.by_module.get(key, ())
        own_kwargs = self.with_kwargs.get(key, ())
        own_inputs = self.inputs.get(key, ())
        if not (own or own_kwargs or own_inputs or self.callbacks):
            return
        if not training_forward():
            return
        for callback in own_inputs:
            callback(module, args, kwargs)
        for callback in self.callbacks:
            callback(module, args, output)
        for callback in own:
            callback(module, args, output)
        for callback in own_kwargs:
            callback(module, args, kwargs, output)

    def empty(self) -> bool:
        return not (self.callbacks or self.by_module or self.inputs or self.with_kwargs)

    def call_step_pre(self, optimizer: Any, args: Any, kwargs: Any) -> Any:
        """Optimizer pre-hooks may hand ``step`` other arguments (a wrapped closure): chained."""
        changed = None
        self.calling += 1
        try:
            for callback in self.callbacks:
                result = callback(optimizer, args, kwargs)
                if result is not None:
                    args, kwargs = changed = result
        finally:
            self.calling -= 1
        return changed

    def install(self) -> None:
        if self.handle is not None:
            return
        if self.kind in (MODULE_PRE, MODULE_POST):
            _hide_compile_warning()
        if self.kind == MODULE_PRE:
            self.handle = nn_module.register_module_forward_pre_hook(self.call_pre)
        elif self.kind == MODULE_POST:
            self.handle = register_global_forward_hook(
                self.call_post, with_kwargs=True, always_call=True
            )
        elif self.kind == OPTIMIZER_PRE:
            self.handle = optim_module.register_optimizer_step_pre_hook(self.call_step_pre)
        else:
            self.handle = optim_module.register_optimizer_step_post_hook(
                lambda o, a, k: self.call(o)
            )

    def uninstall(self, force: bool = False) -> None:
        if self.handle is not None and self.empty():
            if _COMPILED[0] and _blocks and not force:  # dynamo guards on their number
                return
            if self.calling:
                self.pending = True
                return
            self.pending = False
            self.handle.remove()
            self.handle = None
            if _SHARED[MODULE_PRE].handle is None and _SHARED[MODULE_POST].handle is None:
                _unhide_compile_warning()


#: What torch says on every call of a ``torch.compile``d module while any global module hook
#: is registered. ampdiag's callbacks take that module as the model and skip what runs in its
#: compiled region (see the module doc), so while its hooks are the only ones the warning is
#: about nothing the user did, and under ``-W error`` (a test suite's setting) it would stop
#: their training: hidden while ampdiag's module hooks are registered, if the user had none.
COMPILE_WARNING = r"Using `torch\.compile\(module\)` when there are global hooks"
_HIDDEN: list[Any] = []  # the filter of ours in `warnings.filters` (at most one)


def _hide_compile_warning() -> None:
    if not _HIDDEN and not any_global_module_hook():
        entry = hide_warning(COMPILE_WARNING, UserWarning)
        if entry is not None:
            _HIDDEN.append(entry)


def _unhide_compile_warning() -> None:
    while _HIDDEN:
        unhide_warning(_HIDDEN.pop())


def _release_pending() -> None:
    """Removes torch's hooks whose removal waited for their call to end (see `_Shared`)."""
    if _blocks <= 1:
        for shared in _SHARED.values():
            if shared.pending:
                shared.uninstall()


_SHARED = {kind: _Shared(kind) for kind in (MODULE_PRE, MODULE_POST, OPTIMIZER_PRE, OPTIMIZER_POST)}


class Handle:
    """Removes one callback (safe to call twice)."""

    def __init__(
        self,
        shared: _Shared,
        callback: Callable[..., Any],
        table: dict[int, tuple[Callable[..., Any], ...]] | None = None,
        key: int = 0,
    ) -> None:
        self._shared: _Shared | None = shared
        self._callback = callback
        self._table, self._key = table, key

    def remove(self) -> None:
        """Removes the callback; torch's hook too when no other block may be iterating it."""
        with _LOCK:
            shared, self._shared = self._shared, None
            if shared is None:
                return
            if self._table is None:
                shared.callbacks = tuple(c for c in shared.callbacks if c is not self._callback)
            else:
                left = tuple(c for c in self._table.get(self._key, ()) if c is not self._callback)
                if left:
                    self._table[self._key] = left
                else:
                    self._table.pop(self._key, None)
            if _blocks <= 1:  # no other block's thread may be iterating torch's dict
                shared.uninstall()


def add(kind: str, callback: Callable[..., Any]) -> Handle:
    """Adds a callback of one kind (`MODULE_PRE`, `MODULE_POST`, `OPTIMIZER_PRE`, ...).

    Module hooks get (module, args[, output]); optimizer pre-hooks get (optimizer, args,
    kwargs) and may return new (args, kwargs); post-hooks get (optimizer).
    """
    with _LOCK:
        _release_pending()
        shared = _SHARED[kind]
        shared.callbacks = (*shared.callbacks, callback)
        shared.install()
        return Handle(shared, callback)


def on_module(module: torch.nn.Module, kind: str, callback: Callable[..., Any]) -> Handle:
    """Adds a callback for one module's forwards, kept here rather than on the module.

    ``MODULE_PRE``: (module, args) before its forward; ``MODULE_POST``: (module, args,
    output) after it (also when it raised); ``MODULE_INPUTS``: (module, args, kwargs) after
    it; ``MODULE_POST_KWARGS``: (module, args, kwargs, output) after it (kwargs ``{}`` when
    it raised). Only training forwards call it (see the module doc).
    """
    with _LOCK:
        shared = _SHARED[MODULE_PRE if kind == MODULE_PRE else MODULE_POST]
        tables = {MODULE_INPUTS: shared.inputs, MODULE_POST_KWARGS: shared.with_kwargs}
        table = tables.get(kind, shared.by_module)
        table[id(module)] = (*table.get(id(module), ()), callback)
        shared.install()
        return Handle(shared, callback, table, id(module))


def block_started() -> None:
    """Counts a diagnose() block in (call before it adds callbacks)."""
    global _blocks
    with _LOCK:
        _release_pending()
        _blocks += 1
        _threads.append(threading.get_ident())


def block_ended() -> None:
    """Counts a block out (after it removed its callbacks); the last one removes torch's hooks.

    So does one whose other blocks all run in its own thread (a window's block inside the
    run-wide one): no other thread may be iterating torch's dicts, and a long run goes on
    without the module hooks a window needed.
    """
    global _blocks
    with _LOCK:
        _blocks = max(0, _blocks - 1)
        me = threading.get_ident()
        if me in _threads:
            _threads.remove(me)
        if _blocks == 0:
            _threads.clear()
            for shared in _SHARED.values():
                shared.uninstall(force=True)
        elif all(t == me for t in _threads):
            for shared in _SHARED.values():
                shared.uninstall()


# Root models: id(module) -> (pre callbacks, post callbacks), called by their class's patched
# ``__call__`` (`on_root`); ids whose call that wrapper is handling now (`first_call`).
_ROOTS: dict[int, tuple[tuple[Callable[..., Any], ...], tuple[Callable[..., Any], ...]]] = {}
_HANDLING: dict[int, tuple[Callable[..., Any], ...]] = {}  # id -> the pre callbacks it called
# Patched classes: cls -> [its own __call__ before (None: inherited), roots that need it].
_CLASSES: dict[type, list[Any]] = {}


def _root_call(original: Callable[..., Any]) -> Callable[..., Any]:
    """A class's ``__call__`` that calls its watched roots' callbacks around ``original``."""

    def __call__(self: Any, *args: Any, **kwargs: Any) -> Any:
        if _is_compiling():  # asked first: nothing read here becomes a guard
            _COMPILED[0] = True
            return original(self, *args, **kwargs)
        key = id(self)
        own = _ROOTS.get(key)
        if own is None or key in _HANDLING or not _grad_enabled() or in_backward():
            return original(self, *args, **kwargs)
        pre = own[0]
        _HANDLING[key] = pre
        try:
            for callback in pre:
                callback(self, args)
            try:
                output = original(self, *args, **kwargs)
            except BaseException:
                for callback in _ROOTS.get(key, ((), ()))[1]:
                    callback(self, args, kwargs, None)
                raise
            # read now: a callback added during the forward (`first_call`) ends with it
            for callback in _ROOTS.get(key, ((), ()))[1]:
                callback(self, args, kwargs, output)
            return output
        finally:
            del _HANDLING[key]

    __call__.__wrapped__ = original  # type: ignore[attr-defined]
    return __call__


class RootHandle:
    """Removes one root's callbacks, and its class's patch with the last root (safe twice)."""

    def __init__(self, module: torch.nn.Module, pre: Callable[..., Any], post: Callable[..., Any]):
        self._key, self._cls = id(module), type(module)
        self._callbacks: tuple[Callable[..., Any], Callable[..., Any]] | None = (pre, post)

    def remove(self) -> None:
        """Removes the callbacks; the class's own ``__call__`` returns with its last root."""
        with _LOCK:
            callbacks, self._callbacks = self._callbacks, None
            if callbacks is None:
                return
            pre, post = _ROOTS.get(self._key, ((), ()))
            pre = tuple(c for c in pre if c is not callbacks[0])
            post = tuple(c for c in post if c is not callbacks[1])
            if pre or post:
                _ROOTS[self._key] = (pre, post)
            else:
                _ROOTS.pop(self._key, None)
            entry = _CLASSES.get(self._cls)
            if entry is None:
                return
            entry[1] -= 1
            if entry[1] > 0:
                return
            del _CLASSES[self._cls]
            if vars(self._cls).get("__call__") is not entry[2]:
                return  # replaced by someone else meanwhile: theirs stays (ours passes through)
            if entry[0] is None:
                delattr(self._cls, "__call__")
            else:
                setattr(self._cls, "__call__", entry[0])  # noqa: B010


def on_root(
    module: torch.nn.Module, pre: Callable[..., Any], post: Callable[..., Any]
) -> RootHandle:
    """Calls ``pre`` and ``post`` around each training forward of a root ``module``.

    ``pre(module, args)`` before, ``post(module, args, kwargs, output)`` after (``output``
    None when it raised). No torch hook: ``type(module).__call__`` is wrapped (see the module
    doc). A forward already running when this is called is not seen (`first_call` delivers it).
    """
    with _LOCK:
        key, cls = id(module), type(module)
        old_pre, old_post = _ROOTS.get(key, ((), ()))
        _ROOTS[key] = ((*old_pre, pre), (*old_post, post))
        entry = _CLASSES.get(cls)
        if entry is None:
            own = vars(cls).get("__call__")
            current = cls.__call__
            # a subclass of a patched class wraps the real call, not the parent's wrapper
            original = getattr(current, "__wrapped__", current) if _is_ours(current) else current
            wrapper = _root_call(original)
            entry = _CLASSES[cls] = [own, 0, wrapper]
            setattr(cls, "__call__", wrapper)  # noqa: B010
        entry[1] += 1
        return RootHandle(module, pre, post)


def _is_ours(fn: Any) -> bool:
    return any(entry[2] is fn for entry in _CLASSES.values())


def first_call(module: torch.nn.Module, args: Any) -> None:
    """Delivers a root's callbacks to the forward running now (the one that found the model).

    Called from a module pre-callback of that forward: its ``pre`` now, its ``post`` when the
    forward ends (from torch's global post hook, registered then). Where the class's wrapper
    already handles this call (a model given to ``diagnose()``, or watched by another block),
    only the ``pre`` callbacks added since it began (the wrapper calls every ``post``).
    """
    key = id(module)
    own = _ROOTS.get(key)
    if own is None:
        return
    taken = _HANDLING.get(key)
    if taken is not None:
        for callback in own[0]:
            if all(callback is not c for c in taken):
                callback(module, args)
        return
    pre, post = own
    for callback in pre:
        callback(module, args)
    handle: list[Handle] = []

    def once(m: Any, a: Any, kwargs: Any, output: Any) -> None:
        handle[0].remove()
        for callback in post:
            callback(m, a, kwargs, output)

    handle.append(on_module(module, MODULE_POST_KWARGS, once))


class SampledHooks:
    """One post-forward callback on each of a growing list of modules, armed on some steps.

    A sampled collector hooks its modules only for the steps it samples (other steps run
    without them): ``add`` learns a module (hooked at once while armed), ``arm(True/False)``
    hooks or unhooks them all. The callback is ``callback(index, module, args, output)``.
    """

    def __init__(self, callback: Callable[..., Any]) -> None:
        self._callback = callback
        self.modules: list[torch.nn.Module] = []
        self._handles: list[Handle] = []

    def add(self, module: torch.nn.Module, hook_now: bool) -> int:
        """Learns ``module`` (hooked now when ``hook_now``); returns its index."""
        self.modules.append(module)
        if hook_now:
            self._hook(len(self.modules) - 1)
        return len(self.modules) - 1

    def arm(self, on: bool) -> None:
        """Hooks every module (``on``) or removes every hook."""
        if on and not self._handles:
            for idx in range(len(self.modules)):
                self._hook(idx)
        elif not on:
            for handle in self._handles:
                handle.remove()
            self._handles.clear()

    def _hook(self, idx: int) -> None:
        hook = partial(self._callback, idx)
        self._handles.append(on_module(self.modules[idx], MODULE_POST, hook))
