"""What the GPU checks share: a stream held back by a spin, and the stalls to try."""

from __future__ import annotations

import torch

__all__ = ["STALLS_MS", "stall"]

#: Each try 4x longer: the host must acquire and fill its buffers before the stall ends.
STALLS_MS = (100, 400, 1600)


def stall(stream: torch.cuda.Stream, cycles: int) -> torch.cuda.Event:
    """Hold *stream* back by a spin of *cycles* GPU clock cycles; return the spin's end event.

    Work queued on *stream* after this runs only once the spin is over: while the event is
    pending, none of that work has started.
    """
    with torch.cuda.stream(stream):
        torch.cuda._sleep(cycles)  # type: ignore[no-untyped-call]
    end = torch.cuda.Event()  # type: ignore[no-untyped-call]
    end.record(stream)
    return end
