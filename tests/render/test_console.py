"""The console prints a fix so that its code can be copied and run: prose wrapped, code whole."""

from __future__ import annotations

import textwrap

from ampdiag.render.console import INDENT, _fix_lines

#: The shape of a real fix (autocast-slower's): comments, a statement, a block with a body.
FIX = (
    "# Autocast on this CPU is 5.9x slower: for this model size the casts cost more than the "
    "low-precision kernels save.\n"
    "# Train in FP32 here and keep autocast for the GPU:\n"
    "use_amp = device.type == 'cuda'\n"
    "with torch.autocast(device_type=device.type, dtype=torch.float16, enabled=use_amp):\n"
    "    loss = loss_fn(model(x), y)"
)


def _code_of(lines: list[str]) -> str:
    """The code block under the label, as a user would copy it (common margin removed)."""
    body = [line for line in lines[1:] if line.startswith(INDENT + "    ")]
    return textwrap.dedent("\n".join(body))


def test_code_of_a_fix_is_printed_whole_and_compiles() -> None:
    lines = _fix_lines("fix", FIX, width=80)
    assert lines[0].strip() == "fix:"
    code = _code_of(lines)
    compile(code, "<console>", "exec")  # a wrapped or re-indented line would not compile
    # Statements keep their relative indentation, each on one line.
    assert "use_amp = device.type == 'cuda'\nwith torch.autocast(" in code
    assert "enabled=use_amp):\n    loss = loss_fn(model(x), y)" in code
    # The long comment is wrapped into comment lines, none wider than the terminal.
    assert all(len(line) <= 80 for line in lines if line.lstrip().startswith("#"))
    words = " ".join(line.strip().lstrip("# ") for line in lines if "#" in line)
    assert "the casts cost more than the low-precision kernels save." in words


def test_prose_is_wrapped_and_a_sentence_ending_in_a_colon_is_prose() -> None:
    fix = "Load batches in worker processes so the next one is ready when the step ends:\n" + (
        "loader = DataLoader(dataset, num_workers=4)"
    )
    lines = _fix_lines("fix", fix, width=60)
    assert lines[0].startswith(INDENT + "fix: Load batches")
    assert all(len(line) <= 60 for line in lines[:-1])
    assert lines[-1] == INDENT + "    loader = DataLoader(dataset, num_workers=4)"
