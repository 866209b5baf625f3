"""The exit is atomic: the user's exception, a second Ctrl-C, global settings.

Whatever the user's objects do on the way out, every hook and patch is removed first (checked
by comparing torch's functions and hook tables with the originals), the user's exception comes
out unchanged (the same object), and the process's warning filters and matplotlib backend are
as they were.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.robustness.subproc import result, run_python

# Each scenario starts a Python with torch (a few seconds).
pytestmark = pytest.mark.slow


def test_an_exception_whose_str_and_repr_raise_still_tears_down(tmp_path: Path) -> None:
    values = result(
        run_python(
            """
            class Broken(Exception):
                def __str__(self):
                    raise ValueError("broken __str__")
                def __repr__(self):
                    raise ValueError("broken __repr__")

            model, opt = make()
            scaler = torch.amp.GradScaler("cpu")
            raised = Broken()
            try:
                with ampdiag.diagnose(out=TMP + "/run", **QUIET) as d:
                    steps(3, model, opt)
                    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                    scaler.scale(torch.ones((), requires_grad=True))
                    raise raised
            except Broken as exc:
                same = exc is raised
            report(
                same=same,
                status=d.session.status,
                error=d.session.error,
                left=leftovers(),
                hooks_on_model=model_hooks(model),
            )
            """,
            tmp_path,
        )
    )
    assert values["same"] is True
    assert values["status"] == "error"
    error = values["error"]
    assert isinstance(error, dict)
    assert error["type"] == "Broken"
    assert "could not be read" in error["message"]
    assert values["left"] == []
    assert values["hooks_on_model"] == 0


def test_a_huge_message_is_capped_in_the_session(tmp_path: Path) -> None:
    values = result(
        run_python(
            """
            model, opt = make()
            try:
                with ampdiag.diagnose(out=TMP + "/run", **QUIET) as d:
                    steps(2, model, opt)
                    raise RuntimeError("x" * 50_000_000)
            except RuntimeError as exc:
                length = len(str(exc))
            import os
            report(length=length, message=len(d.session.error["message"]),
                   file=os.path.getsize(TMP + "/run/session.json"), left=leftovers())
            """,
            tmp_path,
        )
    )
    assert values["length"] == 50_000_000  # the user's exception is untouched
    assert values["message"] < 3000
    assert values["file"] < 1_000_000  # type: ignore[operator]
    assert values["left"] == []


SECOND_INTERRUPT = """
import signal
from ampdiag.config import DiagnoseConfig
from ampdiag.sources.live.collectors import Collector, default_collectors

class SecondCtrlC(Collector):
    # Stops first (collectors stop in reverse order): the interrupt lands with the model's
    # hooks and torch's patches still to be removed.
    name = "second-ctrl-c"
    def stop(self, run):
        {how}

config = DiagnoseConfig(**QUIET, speed_probe_repeats=1)
model, opt = make()
interrupts = 0
try:
    with ampdiag.diagnose(out=TMP + "/run", collectors=[*default_collectors(config), SecondCtrlC()],
                          **QUIET) as d:
        steps(3, model, opt)
        raise KeyboardInterrupt  # the first Ctrl-C
except KeyboardInterrupt as exc:
    interrupts += 1
    second = exc.__context__ is not None
report(interrupts=interrupts, second=second, left=leftovers(), hooks_on_model=model_hooks(model))
"""


def test_a_second_ctrl_c_during_exit_still_tears_down_everything(tmp_path: Path) -> None:
    for how in ("signal.raise_signal(signal.SIGINT)", "raise KeyboardInterrupt"):
        values = result(run_python(SECOND_INTERRUPT.format(how=how), tmp_path))
        assert values["interrupts"] == 1, how
        assert values["second"] is True, how  # the second interrupt, raised after teardown
        assert values["left"] == [], how
        assert values["hooks_on_model"] == 0, how


def test_the_block_leaves_warning_filters_as_found(tmp_path: Path) -> None:
    values = result(
        run_python(
            """
            warnings.simplefilter("default", DeprecationWarning)
            model, opt = make()
            before = [repr(f) for f in warnings.filters]
            with ampdiag.diagnose(out=TMP + "/run", console=True) as d:
                steps(6, model, opt)
            after = [repr(f) for f in warnings.filters]
            report(
                added=[f for f in after if f not in before],
                removed=[f for f in before if f not in after],
                report=(d.out / "report.html").is_file(),
            )
            """,
            tmp_path,
        )
    )
    assert values["report"] is True
    assert values["added"] == []
    assert values["removed"] == []


def test_the_block_leaves_the_matplotlib_backend_as_found(tmp_path: Path) -> None:
    values = result(
        run_python(
            """
            import matplotlib
            matplotlib.use("svg")
            model, opt = make()
            with ampdiag.diagnose(out=TMP + "/run", console=False) as d:
                steps(6, model, opt)
            report(backend=matplotlib.get_backend(), report=(d.out / "report.html").is_file())
            """,
            tmp_path,
        )
    )
    assert values["report"] is True
    assert values["backend"] == "svg"


def test_the_speed_probe_leaves_the_models_python_state_alone(tmp_path: Path) -> None:
    values = result(
        run_python(
            """
            class Counting(nn.Module):
                def __init__(self):
                    super().__init__()
                    self.fc = nn.Linear(16, 4)
                    self.calls = 0

                def forward(self, x):
                    self.calls += 1  # Python state the user's training may depend on
                    return self.fc(x) * (1.0 + 0.01 * (self.calls % 3))

            def run(diagnosed):
                torch.manual_seed(0)
                model = Counting()
                opt = torch.optim.SGD(model.parameters(), lr=0.1)
                if diagnosed:
                    with ampdiag.diagnose(out=TMP + "/run", console=False, report=False,
                                          tensorboard=False, speed_probe_repeats=2) as d:
                        steps(4, model, opt)
                    probed = d.session.section("speed_probe").get("fp32_ms") is not None
                else:
                    steps(4, model, opt)
                    probed = None
                steps(3, model, opt)
                return model, probed

            plain, _ = run(False)
            watched, probed = run(True)
            same = all(torch.equal(a, b) for a, b in zip(plain.parameters(), watched.parameters()))
            report(calls=(plain.calls, watched.calls), same=same, probed=probed)
            """,
            tmp_path,
        )
    )
    assert values["probed"] is True  # the probe did run its extra forwards (on a copy)
    assert values["calls"] == [7, 7]
    assert values["same"] is True


def test_session_json_of_a_broken_exception_is_valid(tmp_path: Path) -> None:
    result(
        run_python(
            """
            class Loud(Exception):
                def __str__(self):
                    raise KeyboardInterrupt  # even a BaseException from __str__
            model, opt = make()
            try:
                with ampdiag.diagnose(out=TMP + "/run", **QUIET):
                    steps(2, model, opt)
                    raise Loud()
            except Loud:
                pass
            report(left=leftovers())
            """,
            tmp_path,
        )
    )
    session = json.loads((tmp_path / "run" / "session.json").read_text())
    assert session["status"] == "error"
    assert session["error"]["type"] == "Loud"
