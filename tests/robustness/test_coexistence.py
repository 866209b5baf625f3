"""One profiler at a time, blocks nested, in threads and exited out of order: never a crash.

Each scenario runs in its own interpreter: two Kineto profilers at once end the process with a
segmentation fault, which must fail the test, not the test run. Each checks what it can
measure independently: the user's own profiler's event count, each session's step count
against the steps its thread ran, and what is left patched or hooked in torch afterwards.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.robustness.subproc import result, run_python

# Each scenario starts a Python with torch (a few seconds).
pytestmark = pytest.mark.slow


def test_users_profiler_inside_the_block_records_whole_and_ours_steps_aside(
    tmp_path: Path,
) -> None:
    values = result(
        run_python(
            """
            model, opt = make()
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                with ampdiag.diagnose(out=TMP + "/run", **QUIET) as d:
                    steps(3, model, opt)  # ours is warming up / recording by now
                    cpu = [torch.profiler.ProfilerActivity.CPU]
                    with torch.profiler.profile(activities=cpu) as p:
                        steps(3, model, opt)
                    steps(2, model, opt)
            mine = [e for e in p.events() if e.name.startswith("aten::addmm")]
            report(
                user_addmm=len(mine),
                steps=len(d.session.steps),
                skipped=d.session.section("profiler").get("skipped"),
                warnings=d.session.section("run")["warnings"],
                python_warnings=[str(w.message) for w in caught if "profiler" in str(w.message)],
                left=leftovers(),
            )
            """,
            tmp_path,
        )
    )
    # The user's profiler saw all its forwards (3 steps x 2 Linear) and the backward's.
    assert values["user_addmm"] >= 6
    assert values["steps"] == 8
    assert "another torch profiler started at step 3" in str(values["skipped"])
    assert any("profiler" in w for w in values["warnings"])  # type: ignore[union-attr]
    assert values["python_warnings"]
    assert values["left"] == []


def test_users_profiler_around_the_block_keeps_its_events(tmp_path: Path) -> None:
    values = result(
        run_python(
            """
            model, opt = make()
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as p:
                with ampdiag.diagnose(out=TMP + "/run", **QUIET) as d:
                    steps(6, model, opt)
            report(
                user_events=len(p.events()),
                user_addmm=len([e for e in p.events() if e.name == "aten::addmm"]),
                skipped=d.session.section("profiler").get("skipped"),
                trace_files=d.session.section("profiler").get("trace_files"),
                left=leftovers(),
            )
            """,
            tmp_path,
        )
    )
    assert values["user_addmm"] >= 12  # 6 steps x 2 Linear forwards, all recorded
    assert "recording when the block began" in str(values["skipped"])
    assert values["trace_files"] == []
    assert values["left"] == []


def test_users_scheduled_profiler_warming_up_around_the_block(tmp_path: Path) -> None:
    values = result(
        run_python(
            """
            from torch.profiler import ProfilerActivity, profile, schedule
            model, opt = make()
            p = profile(activities=[ProfilerActivity.CPU],
                        schedule=schedule(wait=0, warmup=3, active=2, repeat=1))
            p.start()  # Kineto prepared: no flag says so
            with ampdiag.diagnose(out=TMP + "/run", **QUIET) as d:
                for _ in range(6):
                    steps(1, model, opt)
                    p.step()
            p.stop()
            report(
                user_addmm=len([e for e in p.events() if e.name == "aten::addmm"]),
                skipped=d.session.section("profiler").get("skipped"),
                left=leftovers(),
            )
            """,
            tmp_path,
        )
    )
    assert values["user_addmm"] >= 4  # its 2 active steps x 2 Linear forwards
    assert "warming up when the block began" in str(values["skipped"])
    assert values["left"] == []


def test_nested_blocks_each_record_their_own_session_with_one_profiler(tmp_path: Path) -> None:
    values = result(
        run_python(
            """
            model, opt = make()
            with ampdiag.diagnose(out=TMP + "/outer", **QUIET) as outer:
                steps(2, model, opt)
                with ampdiag.diagnose(out=TMP + "/inner", **QUIET) as inner:
                    steps(6, model, opt)
                steps(2, model, opt)
            report(
                outer_steps=len(outer.session.steps),
                inner_steps=len(inner.session.steps),
                outer_traces=len(outer.session.section("profiler")["trace_files"]),
                inner_skipped=inner.session.section("profiler").get("skipped"),
                left=leftovers(),
                tracked=torch.autograd.profiler.KinetoStepTracker._step_dict.get("ProfilerStep"),
                hooks_on_model=model_hooks(model),
            )
            """,
            tmp_path,
        )
    )
    assert values["outer_steps"] == 10
    assert values["inner_steps"] == 6
    assert values["outer_traces"] == 1
    assert values["inner_skipped"]
    assert values["left"] == []
    assert values["tracked"] is None  # ours left torch's step tracker as found
    assert values["hooks_on_model"] == 0


def test_blocks_in_two_threads_keep_their_own_steps(tmp_path: Path) -> None:
    values = result(
        run_python(
            """
            out = {}
            start = threading.Barrier(2)

            def work(name, n):
                model, opt = make(seed=n)
                start.wait()
                with ampdiag.diagnose(out=TMP + "/" + name, **QUIET) as d:
                    steps(n, model, opt)
                out[name] = d

            threads = [threading.Thread(target=work, args=a) for a in (("a", 9), ("b", 5))]
            [t.start() for t in threads]
            [t.join() for t in threads]
            profiled = [n for n, d in out.items() if d.session.section("profiler")["trace_files"]]
            report(
                a=len(out["a"].session.steps),
                b=len(out["b"].session.steps),
                profiled=profiled,
                left=leftovers(),
            )
            """,
            tmp_path,
        )
    )
    assert (values["a"], values["b"]) == (9, 5)
    assert len(values["profiled"]) <= 1  # type: ignore[arg-type]
    assert values["left"] == []


def test_blocks_exited_out_of_order_remove_exactly_their_own(tmp_path: Path) -> None:
    values = result(
        run_python(
            """
            from contextlib import ExitStack
            results = {}
            for profile in (False, True):
                model, opt = make()
                a = ampdiag.diagnose(out=f"{TMP}/a{profile}", profile=profile, **QUIET)
                b = ampdiag.diagnose(out=f"{TMP}/b{profile}", profile=profile, **QUIET)
                sa, sb = ExitStack(), ExitStack()
                sa.enter_context(a)
                steps(1, model, opt)
                sb.enter_context(b)
                steps(6, model, opt)
                sa.close()  # the outer one first
                steps(2, model, opt)  # b still observes; a must see nothing more
                left_between = leftovers()
                sb.close()
                steps(2, model, opt)  # neither observes
                results[str(profile)] = dict(
                    a=len(a.session.steps), b=len(b.session.steps),
                    left=leftovers(), hooks_on_model=model_hooks(model),
                    between=left_between,
                )
            report(**results)
            """,
            tmp_path,
        )
    )
    for profile in ("False", "True"):
        case = values[profile]
        assert isinstance(case, dict)
        assert (case["a"], case["b"]) == (7, 8), profile
        assert case["left"] == [], profile
        assert case["hooks_on_model"] == 0, profile
        assert case["between"], "b's patches must still be in place while it is open"


def test_another_thread_training_leaves_no_dispatch_mode_on_the_blocks_thread(
    tmp_path: Path,
) -> None:
    values = result(
        run_python(
            """
            model, opt = make()
            with ampdiag.diagnose(out=TMP + "/run", precision_step=0, **QUIET) as d:
                t = threading.Thread(target=steps, args=(4, model, opt))
                t.start()
                t.join()
                modes_in_block = torch._C._len_torch_dispatch_stack()
            report(
                modes_in_block=modes_in_block,
                steps=len(d.session.steps),
                left=leftovers(),
            )
            """,
            tmp_path,
        )
    )
    assert values["modes_in_block"] == 0
    assert values["steps"] == 0  # the block observes the thread that entered it
    assert values["left"] == []
