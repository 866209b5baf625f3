"""msgspec's decoding of trace events, where the compiled scanner is not built or refuses.

The fast reader (:mod:`ampdiag.trace.fastread`) uses it for such parts.

A run of events is decoded at once into small typed structs that hold only the fields the
analysis needs: for complete (``"X"``) events ``name``, ``cat``, ``pid``, ``ts``, ``dur`` and
``args.stream`` / ``args.correlation``; for events of any other phase, nothing. Every other
field is skipped by msgspec without building a Python object. Imported only when needed, so a
reading with the compiled scanner does not pay for importing msgspec.
"""

from __future__ import annotations

from typing import Annotated, Any, Union

import msgspec

from ampdiag.trace.reader import Fallback

_Finite = Annotated[float, msgspec.Meta(ge=-1e300, le=1e300)]
_Duration = Annotated[float, msgspec.Meta(ge=0.0, le=1e300)]


class _Args(msgspec.Struct, gc=False):
    stream: int = -1
    correlation: int = -1


class Complete(msgspec.Struct, gc=False, tag_field="ph", tag="X"):
    """A complete event: what the analysis reads of it."""

    name: str
    cat: str
    ts: _Finite
    dur: _Duration
    pid: int | str | None = None
    args: _Args | None = None


# Every other phase of the Chrome trace format: decoded to an empty struct (all fields skipped).
_PHASES: tuple[str, ...] = ("B", "E", "i", "I", "C", "b", "n", "e", "s", "t", "f", "P", "O")
_PHASES += ("N", "D", "M", "V", "v", "R", "c", "(", ")", "T", "S", "p", "F")
_OTHER = tuple(
    msgspec.defstruct(f"_Phase{i}", [], gc=False, tag_field="ph", tag=ph)
    for i, ph in enumerate(_PHASES)
)
_EVENT: Any = Union.__getitem__((Complete, *_OTHER))
DECODER: Any = msgspec.json.Decoder(list[_EVENT])


def decode_list(data: Any) -> list[Any]:
    """The events of a JSON array of trace events (a run the fast reader cut).

    Raises:
        Fallback: Anything msgspec or the structs do not accept.
    """
    try:
        return DECODER.decode(data)  # type: ignore[no-any-return]
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise Fallback(str(exc)) from None
