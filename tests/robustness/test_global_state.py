"""Every global table a diagnose() block may touch is back exactly as found, whatever the block.

Truth: a snapshot taken from outside, by reading torch's and Python's own state, entry by entry
(not ampdiag's bookkeeping): every ``_global_*`` attribute of ``torch.nn.modules.module`` and
``torch.optim.optimizer`` (hook dicts with their keys and the identity of each value, flags),
the dispatch and torch-function mode stacks, the saved-tensors default hooks, ``warnings``'
filters, autocast (CPU and CUDA), grad, inference and anomaly mode, the profiler, the SIGINT
handler, trace/profile functions and the methods ampdiag may patch. It is compared before and
after blocks that end normally, raise, are interrupted (KeyboardInterrupt raised in the block and
a real SIGINT), nest, and run in two threads at once or beside a thread training without one.

Each shape runs in a fresh interpreter, so the block is the process's first: the lazy imports
made during it (and the warning filters they add) are part of what is checked.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from tests.robustness.subproc import result, run_python

SNAPSHOT = """
import signal, sys, os, threading
from torch.utils._python_dispatch import _get_current_dispatch_mode_stack
from torch.overrides import _get_current_function_mode_stack

def _table(value):
    if isinstance(value, dict):
        return [(repr(k), v if isinstance(v, (bool, int, str, type(None))) else id(v))
                for k, v in value.items()]
    return repr(value)

def snapshot():
    out = {}
    for mod in (nn_module, optim_module):
        for name, value in sorted(vars(mod).items()):
            if name.startswith("_global"):
                out[f"{mod.__name__}.{name}"] = _table(value)
    out["dispatch modes"] = [type(m).__name__ for m in _get_current_dispatch_mode_stack()]
    out["torch-function modes"] = [type(m).__name__ for m in _get_current_function_mode_stack()]
    out["saved-tensors hooks"] = repr(torch._C._autograd._top_saved_tensors_default_hooks(False))
    out["warnings.filters"] = [repr(f) for f in warnings.filters]
    out["warnings.defaultaction"] = warnings.defaultaction
    for dev in ("cpu", "cuda"):
        dtype = str(torch.get_autocast_dtype(dev))
        out[f"autocast {dev}"] = [torch.is_autocast_enabled(dev), dtype]
    out["autocast cache"] = torch.is_autocast_cache_enabled()
    out["grad"] = [torch.is_grad_enabled(), torch.is_inference_mode_enabled(),
                   torch.is_anomaly_enabled(), torch.is_anomaly_check_nan_enabled()]
    out["profiler"] = [bool(torch.autograd.profiler._is_profiler_enabled),
                       torch._C._autograd._profiler_enabled()]
    out["leftovers"] = leftovers()
    if threading.current_thread() is threading.main_thread():
        out["SIGINT handler"] = repr(signal.getsignal(signal.SIGINT))
    out["trace/profile"] = [repr(sys.gettrace()), repr(sys.getprofile())]
    out["torch settings"] = [torch.get_num_threads(), str(torch.get_default_dtype()),
                             torch.are_deterministic_algorithms_enabled(),
                             torch.get_float32_matmul_precision()]
    return out

def differences(before, after):
    out = {}
    for k in sorted(set(before) | set(after)):
        b, a = before.get(k), after.get(k)
        if b == a:
            continue
        if isinstance(b, list) and isinstance(a, list):
            out[k] = {"added": [x for x in a if x not in b],
                      "removed": [x for x in b if x not in a],
                      "order": [] if len(a) != len(b) else "changed"}
        else:
            out[k] = [b, a]
    return out

CHECKS = {}

def check(label, before):
    CHECKS[label] = differences(before, snapshot())

FULL = dict(console=False)  # every default collector, the report and TensorBoard included
"""

SHAPES = {
    "normal": """
        model, opt = make()  # the user's optimizer imports dynamo (and sympy's filter)
        before = snapshot()
        with ampdiag.diagnose(out=TMP + "/a", **FULL):
            steps(3, model, opt)
        check("after the block", before)
    """,
    "raises": """
        model, opt = make()  # the user's optimizer imports dynamo (and sympy's filter)
        before = snapshot()
        try:
            with ampdiag.diagnose(out=TMP + "/a", **FULL):
                steps(2, model, opt)
                raise ValueError("the user's")
        except ValueError:
            pass
        check("after the block that raised", before)
    """,
    "keyboard-interrupt": """
        model, opt = make()  # the user's optimizer imports dynamo (and sympy's filter)
        before = snapshot()
        try:
            with ampdiag.diagnose(out=TMP + "/a", **FULL):
                steps(2, model, opt)
                raise KeyboardInterrupt
        except KeyboardInterrupt:
            pass
        check("after KeyboardInterrupt raised in the block", before)
        try:
            with ampdiag.diagnose(out=TMP + "/b", **FULL):
                steps(2, model, opt)
                os.kill(os.getpid(), signal.SIGINT)
                steps(50, model, opt)
        except KeyboardInterrupt:
            pass
        check("after a real SIGINT in the block", before)
    """,
    "nested": """
        model, opt = make()  # the user's optimizer imports dynamo (and sympy's filter)
        before = snapshot()
        with ampdiag.diagnose(out=TMP + "/outer", **FULL):
            steps(2, model, opt)
            inside = snapshot()
            with ampdiag.diagnose(out=TMP + "/inner", **FULL):
                steps(2, model, opt)
            check("in the outer block, after the inner one", inside)
            steps(1, model, opt)
        check("after both blocks", before)
    """,
    "two-threads": """
        made = {"t1": make(1), "t2": make(2)}
        before = snapshot()
        barrier = threading.Barrier(2)
        errors, own = [], {}

        def block(name):
            try:
                mine = snapshot()
                model, opt = made[name]
                with ampdiag.diagnose(model, opt, out=TMP + "/" + name, **FULL):
                    barrier.wait(60)  # both blocks open at once
                    steps(3, model, opt)
                    barrier.wait(60)
                own[name] = differences(mine, snapshot())
            except BaseException as exc:
                errors.append(repr(exc))

        threads = [threading.Thread(target=block, args=(n,)) for n in ("t1", "t2")]
        for t in threads:
            t.start()
        for t in threads:
            t.join(300)
        assert not errors, errors
        for name, diff in own.items():
            CHECKS[f"in thread {name}, after its block"] = diff
        check("after both threads' blocks", before)
    """,
    "another-thread-trains": """
        model, opt = make()
        theirs_model, theirs_opt = make(1)
        before = snapshot()
        inside, imported, entered, done = (threading.Event() for _ in range(4))
        theirs = {}

        def trainer():  # training beside the block, under its own catch_warnings
            mine = snapshot()
            inside.wait(60)
            while not imported.is_set():  # (a catch_warnings here would drop the import's
                steps(1, theirs_model, theirs_opt)  # filter on exit: not thread-safe)
            # Entered after the block's import added its filter, left after the block ended:
            # its exit restores the list it saved, the import's filter with it.
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", DeprecationWarning)
                entered.set()
                while not done.is_set():
                    with warnings.catch_warnings():  # and one per step, as libraries do
                        warnings.simplefilter("ignore", UserWarning)
                        steps(1, theirs_model, theirs_opt)
            theirs["diff"] = differences(mine, snapshot())

        worker = threading.Thread(target=trainer)
        worker.start()
        with open(TMP + "/lazy_filter_mod.py", "w") as f:  # an import that adds a filter
            f.write("import warnings\\nclass W(UserWarning): pass\\n"
                    "warnings.filterwarnings('once', category=W)\\n")
        sys.path.insert(0, TMP)
        with ampdiag.diagnose(model, opt, out=TMP + "/a", **FULL):
            inside.set()
            steps(2, model, opt)
            import lazy_filter_mod  # as torch's lazy imports (sympy) do in a block
            imported.set()
            entered.wait(60)
            steps(2, model, opt)
        done.set()
        worker.join(300)
        CHECKS["in the training thread"] = theirs.get("diff", "the thread did not finish")
        check("after the block and the other thread", before)
    """,
}


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_every_global_table_is_back_as_found(shape: str, tmp_path: Path) -> None:
    code = SNAPSHOT + textwrap.dedent(SHAPES[shape]) + "\nreport(checks=CHECKS)\n"
    proc = run_python(code, tmp_path, timeout=600)
    checks = result(proc)["checks"]
    assert isinstance(checks, dict) and checks, checks
    left = {label: diff for label, diff in checks.items() if diff}
    assert not left, left
