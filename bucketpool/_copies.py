"""Copies bucketpool sees begin, and the releases that come before they end (issue 35).

A copy op that bucketpool wraps (`recording`: ``bucketpool.vllm.install()`` wraps vLLM's
``swap_blocks_batch``; `bucketpool.testing.HostDevice` is one) records an end event right
after each copy whose descriptors a pool handed out, on the stream the copy ran on, and adds
it to that hand-out's events (`copied`).  A release before it is done parks the buffer until
it is, at every level: the next holder cannot overwrite what the copy reads.  `early` then
reports it: once per pair of lines at ``checks``, as `ReleaseError` at ``strict``.
"""

from __future__ import annotations

import functools
import warnings
import weakref
from collections.abc import Callable
from typing import Any, TypeVar, cast, final

import torch

from bucketpool import _debug
from bucketpool._errors import InFlightReleaseWarning, ReleaseError

__all__ = ["LEDGERS", "Copy", "copied", "early", "recording"]

_Op = TypeVar("_Op", bound=Callable[..., Any])
Event = Any  # a `CompletionEvent` (`_views` is not imported: the import chain stays short)
#: Every pool's ledger in the process (`_ledger.Ledger`): where `copied` looks a tensor up.
LEDGERS: weakref.WeakSet[Any] = weakref.WeakSet()


@final
class Copy:
    """An end event bucketpool recorded after a copy (`copied`), and where the copy began."""

    __slots__ = ("event", "site")

    def __init__(self, event: Event, site: _debug.Site) -> None:
        self.event, self.site = event, site

    def query(self) -> bool:
        """Whether the copy has ended."""
        return bool(self.event.query())

    def synchronize(self) -> None:
        """Wait for the copy to end where its event can wait (the pool then polls `query`)."""
        if callable(getattr(self.event, "synchronize", None)):
            self.event.synchronize()


def copied(tensor: torch.Tensor, end: Callable[[], Event | None], site: _debug.Site) -> bool:
    """A copy reading *tensor* just began: record ``end()`` on its hand-out, if a pool's.

    *tensor* is a descriptor field a pool handed out, from its first entry (as
    ``bufs.src_ptrs[:count]`` is); *end* records the copy's end event (None: the copy is
    over); *site* is where the copy began (`_debug.site`).  Returns whether it recorded one.
    """
    key = tensor.data_ptr()
    for ledger in [*LEDGERS]:
        buffer = ledger.registry.get(key)  # (a hint: the record decides)
        if buffer is not None:
            token = buffer.token
            event = end() if token > 0 else None
            return event is not None and buffer.record(token, Copy(event, site))
    return False


def recording(op: _Op) -> _Op:
    """Wrap *op*, vLLM's ``swap_blocks_batch`` (the descriptors first): see `copied`."""

    @functools.wraps(op)
    def swap_blocks_batch(src_ptrs: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        result = op(src_ptrs, *args, **kwargs)
        if isinstance(src_ptrs, torch.Tensor):  # (else the op raised)
            copied(src_ptrs, _end_event, _debug.site(False))
        return result

    return cast("_Op", swap_blocks_batch)


def _end_event() -> Event | None:
    """An event recorded now on the current stream; None on the CPU (its copies are over)."""
    event = torch.Event()
    if getattr(event, "device", None) == _CPU:
        return None
    event.record()
    return event


_CPU = torch.device("cpu")


def early(pool: Any, buffer: Any, pending: list[Any]) -> ReleaseError | None:
    """Report a release made while a copy bucketpool saw could still read (`Copy`)."""
    copies = [event for event in pending if type(event) is Copy]
    if not copies:
        return None
    began, released = copies[0].site, cast("_debug.Site", buffer.released_at)
    message = (
        f"a buffer (n={buffer.n}, capacity {buffer.bucket.capacity}) was released at "
        f"{_debug.format_site(released)} while the copy that began at "
        f"{_debug.format_site(began)} could still read its descriptors; "
        "it stays parked until the copy ends, so nothing is overwritten, but release it "
        "only once the copy's end event is done (or pass that event to the release)"
    )
    if pool._settings.debug == "strict":  # (the cause says the release took effect)
        error = ReleaseError(message)
        error.__cause__ = InFlightReleaseWarning(message)
        return error
    line = _debug.line_of(released)
    key = ("early", _debug.line_of(began), line)
    if key not in pool._reported:  # (this caller's own mistake: an "error" filter raises it)
        pool._reported.add(key)
        where = line or ("<unknown>", 0)
        warnings.warn_explicit(message, InFlightReleaseWarning, *where, module="bucketpool")
    return None
