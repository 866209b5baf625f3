"""The exit's garbage collections leave the objects alive before it aside, and restore the GC.

A full collection walks every object the collector tracks; the exit allocates enough to
trigger one, and on a real script's process (torch's and the user's objects) it cost 115 ms
of the exit. Truth: the collector's own lists -- an object set aside (frozen) is in none of
the generations ``gc.get_objects()`` walks -- and its state after the block.
"""

from __future__ import annotations

import gc
from pathlib import Path
from typing import Any

import pytest

import ampdiag
from ampdiag.sources.live import diagnosis
from tests.conftest import QUIET, train


class _Marker:
    """A user's object, tracked by the collector, alive across the block."""


def _in_collected_generations(obj: Any) -> bool:
    return any(o is obj for o in gc.get_objects())


def test_the_exit_walks_none_of_the_users_objects_and_restores_the_collector(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    marker = _Marker()
    assert _in_collected_generations(marker)
    seen: list[bool] = []
    real = diagnosis.Diagnosis._build_session

    def watching(self: Any, *args: Any, **kwargs: Any) -> Any:
        seen.append(_in_collected_generations(marker))
        return real(self, *args, **kwargs)

    monkeypatch.setattr(diagnosis.Diagnosis, "_build_session", watching)
    before = gc.get_freeze_count()
    train(steps=3, wrap=lambda: ampdiag.diagnose(out=tmp_path, **QUIET))
    assert seen == [False]  # set aside while the exit ran
    assert gc.get_freeze_count() == before == 0 and gc.isenabled()
    assert _in_collected_generations(marker)  # and back where the collector walks it


def test_objects_the_process_froze_itself_stay_frozen(tmp_path: Path) -> None:
    marker = _Marker()
    gc.freeze()
    try:
        train(steps=3, wrap=lambda: ampdiag.diagnose(out=tmp_path, **QUIET))
        # not unfrozen by the exit (a frozen object that died since has left the count)
        assert gc.get_freeze_count() > 0 and not _in_collected_generations(marker)
    finally:
        gc.unfreeze()
