"""torch.profiler on a schedule: the Kineto trace under out/trace/ and a summary section.

The trace is written gzipped in the file names and layout of torch's own
``tensorboard_trace_handler`` (the ones the TensorBoard profiler plugin reads), compressed at
the fastest level rather than that handler's 9 (or the default 6), which cost the user's exit
several times longer for a smaller file (nanoGPT-style, 10 MB of JSON: level 1 42 ms for 864 kB,
level 6 96 ms for 596 kB), by ISA-L's gzip (a UNet's 64 MB: 50 ms against zlib's 215, the same
5.5 MB). The exit's one read of it (`RunContext.read_trace`) is of the JSON before the gzip.
The section holds the profiled steps, the step-time breakdown read back from that trace, and
the top ops by self time as the profiler's own ``key_averages()`` counts them.
"""

from __future__ import annotations

import contextlib
import copy
import shutil
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch.profiler import ProfilerActivity, profile, schedule

from ampdiag._layout import TRACE_DIR
from ampdiag.compat import profiler as compat_profiler
from ampdiag.config import is_profiled_step
from ampdiag.schema import ProfilerSection
from ampdiag.sources.live import exclusive, native_log
from ampdiag.sources.live.collectors import COLLECTORS
from ampdiag.sources.live.collectors.base import Collector, RunContext
from ampdiag.sources.live.patching import Patches

if TYPE_CHECKING:
    from ampdiag.trace.records import RankTrace

_gzip: Any
try:  # ISA-L's gzip: the same format, 4x faster than zlib's at the fastest level
    from isal import igzip as _gzip
except ImportError:  # pragma: no cover (a platform without its wheel)
    import gzip as _gzip

TOP_OPS = 25
#: A step of more ATen ops than this (the precision audit's count, `RunContext.audited_ops`) is
#: profiled one step, not ``profile_active``: the profiler records about a dozen events an op
#: (the nested ops of a kernel, allocations, autograd links), and each event costs the exit its
#: export, gzip and read back. A diffusion UNet under emulated BF16, 4,600 ops a step (two
#: micro-batches): 54k events a step, three steps about 1 s of its exit (`bench_exit_parts`);
#: timm's ResNet (540), nanoGPT (590) and run_clm's GPT-2 (940) are far below it.
HEAVY_STEP_OPS = 2000


def profiler_activities() -> list[ProfilerActivity]:
    """CPU always; CUDA when a CUDA device is present (its events are needed for GPU time)."""
    activities = [ProfilerActivity.CPU]
    if torch.cuda.is_available():
        activities.append(ProfilerActivity.CUDA)
    return activities


def make_schedule(skip: int, warmup: int, active: int, first: int = 0) -> Any:
    """The profiler schedule: skip the first steps, warm up, record ``active`` steps once.

    ``first``: the run-wide number of the block's first step (a window of a long run): the
    profiler numbers its steps from there (``ProfilerStep#first`` ...), and the schedule
    still counts from the block's first step.
    """
    base = schedule(skip_first=skip, wait=0, warmup=warmup, active=active, repeat=1)
    if not first:
        return base
    return lambda step: base(max(0, step - first))


@COLLECTORS.register
class ProfilerCollector(Collector):
    """Runs torch.profiler over the diagnosed steps on the configured schedule."""

    name = "profiler"
    enabled_by = "profile"
    step_end_last = True

    def __init__(self) -> None:
        self._prof: profile | None = None
        self._trace_dir: Path | None = None
        self._earlier: set[Path] = set()
        self._top_ops: list[dict[str, Any]] = []
        self._recorded_steps: list[int] = []
        self._steps_seen = 0
        self._run: RunContext | None = None
        self._error: str | None = None
        self._skipped: str | None = None
        self._thread = 0
        self._yield_at_step = False
        self._made_before: bool | None = None  # whether torch's step tracker had a profiler
        self._patches = Patches()
        self._native_log: list[str] = []
        # fd 2 held from the warm-up to the stop: the CPU allocator logs every free of a block
        # allocated before profiling (no rate limit without glog), inside the user's steps
        self._window_log: contextlib.ExitStack | None = None
        self._ready: tuple[profile, Any] | None = None
        self._step_began = _now()  # when the step in progress began
        self._active: int | None = None  # the steps recorded when the window was shortened

    def start(self, run: RunContext) -> None:
        """Starts the profiler, unless another one runs (then the block runs without it)."""
        cfg = run.config
        self._run = run
        self._step_began = _now()
        self._thread = threading.get_ident()
        busy = compat_profiler.running()
        if busy is None and not exclusive.claim(exclusive.PROFILER, self):
            busy = "another diagnose() block is profiling"
        if busy is not None:
            self._not_started(run, f"{busy} when the block began")
            return
        self._trace_dir = run.out / TRACE_DIR
        self._trace_dir.mkdir(parents=True, exist_ok=True)
        self._earlier = set(self._trace_dir.glob("*.pt.trace.json*"))
        self._made_before = compat_profiler.made_a_profiler()
        handler = trace_handler(self._trace_dir, _worker_name())

        def on_trace_ready(prof: profile) -> None:
            # Only kept here: writing the trace and reading its ops back take seconds on a
            # real script's window, a stall of the user's loop; `after_stop` does both.
            self._ready = (prof, handler)
            # For collectors that read the same profile (memory): no second profiler.
            run.profile = prof

        self._prof = profile(
            activities=profiler_activities(),
            schedule=make_schedule(
                cfg.profile_skip, cfg.profile_warmup, cfg.profile_active, run.first_step
            ),
            on_trace_ready=on_trace_ready,
            record_shapes=cfg.record_shapes,
            profile_memory=cfg.profile_memory,
            with_stack=cfg.with_stack,
        )
        compat_profiler.number_steps_from(self._prof, run.first_step)
        # A profiler the user's code starts inside the block: ours steps aside first.
        for owner, method in compat_profiler.start_points():
            self._patches.wrap(owner, method, self._watch)
        try:
            if cfg.profile_skip == 0:
                self._hold_native_log()
            with native_log.captured(self._native_log):
                self._prof.start()
        except BaseException:
            self._release()
            raise

    def _hold_native_log(self) -> None:
        """Points fd 2 at a temporary file until the profiler stops (see `native_log`)."""
        if self._window_log is None:
            stack = contextlib.ExitStack()
            stack.enter_context(native_log.captured(self._native_log))
            self._window_log = stack

    def _release_native_log(self) -> None:
        stack, self._window_log = self._window_log, None
        if stack is not None:
            stack.close()

    def _not_started(self, run: RunContext, why: str) -> None:
        self._skipped = why
        run.warn(
            f"ran without torch.profiler: {why} (one profiler at a time; the trace, "
            "step-time breakdown and memory timeline are missing)",
            user=True,
        )

    def _watch(self, original: Callable[..., Any]) -> Callable[..., Any]:
        collector = self

        def start_point(prof: Any, *args: Any, **kwargs: Any) -> Any:
            collector._other_profiler(prof)
            return original(prof, *args, **kwargs)

        return start_point

    def _other_profiler(self, starting: Any) -> None:
        mine = self._prof
        if mine is None or starting is compat_profiler.inner_profile(mine):
            return
        run = self._run
        step = run.step if run is not None else "?"
        if threading.get_ident() != self._thread:
            # Kineto's state is per thread: ours can only be stopped from the block's thread.
            self._yield_at_step = True
            return
        self._stop_profiler()
        if run is not None:
            run.warn(
                f"another torch profiler started at step {step}: ampdiag's profiler stopped "
                "there so that it records whole (the trace and step-time breakdown cover "
                "only the steps before it)",
                user=True,
            )
            self._skipped = f"another torch profiler started at step {step}"

    def on_step_end(self, run: RunContext, step: int) -> None:
        """Advances the profiler's schedule (or stops it when another profiler records)."""
        local = run.window_step(step)  # the schedule counts from the block's first step
        self._steps_seen = local + 1
        began, self._step_began = self._step_began, _now()
        if self._prof is None:
            return
        busy = compat_profiler.running(ignore=self._prof) if self._may_check(local) else None
        if busy is not None or self._yield_at_step:
            self._stop_profiler()
            why = busy or "another torch profiler started in another thread"
            self._skipped = f"{why} at step {step + 1}"
            run.warn(f"ampdiag's profiler stopped at step {step + 1}: {why}", user=True)
            return
        cfg = run.config
        first = cfg.profile_skip + cfg.profile_warmup
        if local + 1 == first:
            self._shorten_for(run, _took(began, self._step_began), step)
        if run.is_profiled(step):
            self._recorded_steps.append(step)
        if self._active is not None and local + 1 >= first + self._active:
            self._stop_profiler()  # the shortened window is over: its trace is written
            return
        if local + 1 >= cfg.profile_skip:
            self._hold_native_log()  # the warm-up begins with this step()
        primer = native_log.prime_allocator_warning()
        with native_log.captured(self._native_log):
            self._prof.step()
            del primer
        if local + 1 >= cfg.profile_skip + cfg.profile_warmup + cfg.profile_active:
            # the window is over and its trace written: stopping now costs nothing later,
            # where stepping an idle profiler cost every step a captured fd 2 and a temp file
            self._stop_profiler()

    def _shorten_for(self, run: RunContext, step_s: float, step: int) -> None:
        """Records one step when the step before the window (``step``) was long or heavy.

        Every event a recorded step holds costs the user's exit (torch's processing of the
        recorded events, its export, reading the trace back). Decided before any is recorded,
        from what identical runs measure alike: the step's own CPU time in the thread that
        trains (``step_s``, `_took`) over ``profile_long_step_s`` (a long step of small ops is
        millions of events, tens of seconds each step; wall time decided it before, and
        identical runs recorded one step or three as the machine's load stretched a 0.4 s
        step past 2 s), or the ATen ops the precision audit counted in that step over
        `HEAVY_STEP_OPS`. ``profile_long_step_s=0`` turns both off. The other collectors see
        the shorter window (`RunContext.is_profiled`).
        """
        cfg = run.config
        if cfg.profile_long_step_s <= 0 or cfg.profile_active <= 1:
            return
        audited, ops = run.audited_ops or (None, 0)
        if cfg.profile_long_step_s <= step_s:
            why = (
                f"steps take {step_s:.1f} s of CPU time (steps over profile_long_step_s="
                f"{cfg.profile_long_step_s:g} s record one"
            )
        elif audited == step and ops > HEAVY_STEP_OPS:
            why = (
                f"step {step} ran {ops:,} ATen ops (the precision audit's count; steps of over "
                f"{HEAVY_STEP_OPS:,} record one"
            )
        else:
            return
        self._active = run.profile_active = 1
        run.warn(
            f"1 step recorded: {why}, each recorded step of many ops costing the exit seconds; "
            f"profile_active={cfg.profile_active} asked, profile_long_step_s=0 records them all)",
            user=True,
        )

    def _may_check(self, step: int) -> bool:
        """Whether to look for another profiler as ``step`` (counted in the block) ends.

        Only when ours is about to warm up or record (then another one would collide), and
        not while ours records (then torch's flag is ours).
        """
        cfg = self._run.config if self._run is not None else None
        if cfg is None:
            return False
        end = cfg.profile_skip + cfg.profile_warmup + cfg.profile_active
        return not is_profiled_step(cfg, step) and cfg.profile_skip <= step + 1 < end

    def stop(self, run: RunContext) -> None:
        """Stops the profiler; a trace of a partly recorded window is still written."""
        self._stop_profiler()

    def after_stop(self, run: RunContext) -> None:
        """Writes the recorded window's trace and reads its top ops, after the user's steps."""
        self._process()
        run.trace_files = self.trace_files()

    def _process(self) -> None:
        ready, self._ready = self._ready, None
        if ready is None:
            return
        prof, handler = ready
        try:
            with native_log.captured(self._native_log):
                handler(prof, self._read)
            if torch.cuda.is_available():  # on the CPU: from the trace file (`section`)
                self._top_ops = top_ops(prof)
        except Exception as exc:  # a failed export is reported, never raised
            self._error = f"{type(exc).__name__}: {exc}"

    def _read(self, path: Path, plain: Path) -> None:
        """The exit's one read of the trace from its JSON (else `section` reads ``path``)."""
        if self._run is not None:
            with contextlib.suppress(Exception):
                self._run.read_trace(path, source=plain)

    def _stop_profiler(self) -> None:
        prof, self._prof = self._prof, None
        try:
            if prof is not None:
                try:
                    with native_log.captured(self._native_log):
                        prof.stop()
                except Exception as exc:  # a failed trace export must not hide the user's error
                    self._error = f"{type(exc).__name__}: {exc}"
        finally:
            self._release()

    def _release(self) -> None:
        self._release_native_log()
        if self._made_before is False:
            compat_profiler.forget_profiler()
            self._made_before = None
        self._prof = None
        self._patches.restore()
        exclusive.release(exclusive.PROFILER, self)

    def trace_files(self) -> list[Path]:
        """The trace files this run wrote, oldest first (not those of an earlier run)."""
        if self._trace_dir is None or not self._trace_dir.is_dir():
            return []
        files = [p for p in self._trace_dir.glob("*.pt.trace.json*") if p not in self._earlier]
        return sorted(files, key=lambda p: p.stat().st_mtime)

    def section(self) -> ProfilerSection | None:
        """Trace files, profiled steps, step-time breakdown and top ops."""
        if self._run is None:
            return None
        self._process()  # when after_stop did not run (a second Ctrl-C during the exit)
        files = self.trace_files()
        out: ProfilerSection = {
            "trace_files": [str(p.relative_to(self._run.out)) for p in files],
            "schedule": {
                "skip": self._run.config.profile_skip,
                "warmup": self._run.config.profile_warmup,
                "active": self._active or self._run.config.profile_active,
            },
            "steps_seen": self._steps_seen,
            "recorded_steps": self._recorded_steps if files else [],
            "top_ops": self._top_ops,
            "error": self._error,
            "skipped": self._skipped,
            "native_log": self._native_log,
        }
        if files:
            trace = self._run.read_trace(files[-1])
            out["breakdown"] = host_breakdown_of(trace, self._recorded_steps)
            if not torch.cuda.is_available():
                out["top_ops"] = host_top_ops(trace)
        return out


def top_ops(prof: profile, limit: int = TOP_OPS) -> list[dict[str, Any]]:
    """The ops with the most self CPU + device time, from ``key_averages()`` (CUDA runs).

    It attributes each kernel's time to the op that launched it. A CPU-only run's are read
    from its trace file instead (`host_top_ops`), which the exit reads anyway: building
    ``key_averages()``' event tree takes seconds on a real script's window.
    """
    rows = [
        {
            "name": avg.key,
            "calls": int(avg.count),
            "self_cpu_us": float(avg.self_cpu_time_total),
            "cpu_total_us": float(avg.cpu_time_total),
            "self_device_us": float(getattr(avg, "self_device_time_total", 0.0) or 0.0),
        }
        for avg in prof.key_averages()
    ]
    rows.sort(key=lambda r: r["self_cpu_us"] + r["self_device_us"], reverse=True)
    return [r for r in rows if not r["name"].startswith("ProfilerStep")][:limit]


def _now() -> tuple[int, float, float]:
    """The calling thread, its CPU time and the wall clock: a step's start or end (`_took`)."""
    return threading.get_ident(), time.thread_time(), time.perf_counter()


def _took(began: tuple[int, float, float], ended: tuple[int, float, float]) -> float:
    """A step's CPU time in the thread that ran it (wall time where two threads marked it).

    The events a step records are made by the thread that dispatches its ops, and another
    process's load does not add to that thread's CPU time.
    """
    return ended[1] - began[1] if began[0] == ended[0] else ended[2] - began[2]


def host_top_ops(trace: RankTrace, limit: int = TOP_OPS) -> list[dict[str, Any]]:
    """The CPU ops with the most self time in a trace read by the trace reader.

    Calls and inclusive time are the reader's (`RankTrace.cpu_ops`: torch's count), self time
    its `RankTrace.cpu_self`; user annotations (``ProfilerStep#N``, ``Optimizer.step#...``)
    are spans, not ops.
    """
    rows: list[dict[str, Any]] = [
        {
            "name": name,
            "calls": int(calls),
            "self_cpu_us": trace.cpu_self.get(name, 0.0),
            "cpu_total_us": total_us,
            "self_device_us": 0.0,
        }
        for name, (calls, total_us) in trace.cpu_ops.items()
    ]
    rows.sort(key=lambda r: r["self_cpu_us"], reverse=True)
    return rows[:limit]


def trace_handler(
    folder: Path, worker: str
) -> Callable[[profile, Callable[[Path, Path], None] | None], None]:
    """Writes a profile's trace as ``<worker>.<time_ns>.pt.trace.json.gz`` in ``folder``.

    torch's ``tensorboard_trace_handler(use_gzip=True)``'s layout, at the fastest level;
    ``read(gzip path, JSON path)`` is called before the JSON is compressed and removed.
    """

    def handler(prof: profile, read: Callable[[Path, Path], None] | None = None) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        plain = folder / f"{worker}.{time.time_ns()}.pt.trace.json"
        packed = plain.with_name(plain.name + ".gz")
        try:
            prof.export_chrome_trace(str(plain))
            if read is not None:
                read(packed, plain)
            with plain.open("rb") as src, _gzip.open(packed, "wb", compresslevel=1) as dst:
                shutil.copyfileobj(src, dst, 1 << 20)
        finally:
            plain.unlink(missing_ok=True)

    return handler


def _worker_name() -> str:
    # The plugin groups traces by worker; host_pid is what torch's handler uses by default.
    import os

    return f"{socket.gethostname()}_{os.getpid()}"


def host_breakdown_of(trace: RankTrace, steps: list[int]) -> dict[str, Any]:
    """The host step-time breakdown of the given steps of a trace read by the trace reader.

    Only the recorded steps count: a run that ends inside the profiler's active window leaves
    a stub ``ProfilerStep`` after the last real one. The trace is not changed (the memory
    timeline reads the same one).
    """
    from ampdiag.analysis.timeline import host_breakdown

    rt = copy.copy(trace)
    rt.steps = [s for s in trace.steps if s[0] in steps]
    return host_breakdown(rt)
