"""Another thread inside ``warnings.catch_warnings`` during the block: no filter left behind.

Truth: ``warnings.filters`` before the block and after both the block and the other thread's
``catch_warnings`` ended, compared entry by entry.
"""

from __future__ import annotations

import sys
import threading
import warnings
from pathlib import Path

import torch

import ampdiag

MODULE = """
import warnings

class LazyWarning(UserWarning):
    pass

warnings.filterwarnings("once", category=LazyWarning)
"""


def test_an_import_filter_does_not_come_back_with_another_threads_catch_warnings(
    tmp_path: Path,
) -> None:
    (tmp_path / "ampdiag_lazy_mod.py").write_text(MODULE)
    sys.path.insert(0, str(tmp_path))
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    settings = {"console": False, "report": False, "tensorboard": False, "speed_probe": False,
                "profile": False}  # fmt: skip
    with ampdiag.diagnose(out=tmp_path / "warm", **settings):  # type: ignore[arg-type]
        model(torch.randn(2, 4)).sum().backward()
        opt.step()
    before = list(warnings.filters)
    entered, leave = threading.Event(), threading.Event()

    def other_thread() -> None:  # training elsewhere, inside torch's or a library's catch_warnings
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            entered.set()
            leave.wait(30)

    worker = threading.Thread(target=other_thread)
    try:
        with ampdiag.diagnose(out=tmp_path / "run", **settings):  # type: ignore[arg-type]
            import ampdiag_lazy_mod  # noqa: F401  (a lazy import that adds a filter)

            worker.start()  # its catch_warnings saves the list with the import's filter
            assert entered.wait(30)
            for _ in range(3):
                model(torch.randn(2, 4)).sum().backward()
                opt.step()
        leave.set()
        worker.join(30)
    finally:
        leave.set()
        sys.path.remove(str(tmp_path))
        sys.modules.pop("ampdiag_lazy_mod", None)
    assert warnings.filters == before
