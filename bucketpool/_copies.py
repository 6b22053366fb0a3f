"""Copies bucketpool sees begin, and the releases that come before they end (issue 35).

A copy op that bucketpool wraps (`recording`: ``bucketpool.vllm.install()`` wraps vLLM's
``swap_blocks_batch``; `bucketpool.testing.HostDevice` is one) adds a pending `Copy` to the
events of the hand-out whose descriptors it reads before the op runs (`begun`), and gives
it the copy's end event once the op returned, recorded on the stream the copy ran on.  A
release before that event is done parks the buffer until it is, at every level: the next
holder cannot overwrite what the copy reads.  `early` then reports it: once per pair of
lines at ``checks``, as `ReleaseError` at ``strict``.
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

__all__ = ["DONE", "INDEX", "Copy", "begun", "early", "recording"]

_Op = TypeVar("_Op", bound=Callable[..., Any])
Event = Any  # a `CompletionEvent` (`_views` is not imported: the import chain stays short)
#: Every pool's buffers not freed, by address (`Buffer.key`), weakly: where `begun` looks a
#: tensor up.  Changed by the ledgers' moves (a dropped pool's buffers leave dead entries).
INDEX: dict[int, weakref.ref[Any]] = {}


@final
class Copy:
    """A copy of a hand-out's descriptors that bucketpool saw begin (`begun`), and where.

    Pending until its end event, set once the op returned (``event``: None until then),
    reports done: a release meanwhile parks the buffer however the op and the release race.
    """

    __slots__ = ("event", "site")

    def __init__(self, site: _debug.Site) -> None:
        self.event: Event | None = None
        self.site = site

    def query(self) -> bool:
        """Whether the copy has ended."""
        event = self.event  # (read once: the op's thread sets it)
        return event is not None and bool(event.query())

    def synchronize(self) -> None:
        """Wait for the copy to end where its event can wait (the pool then polls `query`)."""
        event = self.event
        if event is not None and callable(getattr(event, "synchronize", None)):
            event.synchronize()


@final
class _Done:
    """The end event of a copy that is over (or never began)."""

    def query(self) -> bool:
        return True


DONE = _Done()


def begun(tensor: torch.Tensor, site: _debug.Site) -> Copy | None:
    """A copy reading *tensor* is about to begin: a pending `Copy` on its hand-out, if a pool's.

    *tensor* is a descriptor field a pool handed out, from its first entry (as
    ``bufs.src_ptrs[:count]`` is); *site* is where the copy begins (`_debug.site`).  The
    caller sets the copy's ``event`` once the copy was submitted (`DONE`: none to wait for).
    """
    address = tensor.data_ptr()
    ref = INDEX.get(address)
    buffer = None if ref is None else ref()  # (a hint: the record decides)
    if buffer is None or buffer.base.data_ptr() != address:  # (moved: its old address's now)
        return None
    token, copy = buffer.token, Copy(site)
    try:
        return copy if token > 0 and buffer.record(token, copy) else None
    except BaseException:  # (strict's in-flight write): the copy will not begin
        copy.event = DONE
        raise


def recording(
    op: _Op, end: Callable[[], Event] | None = None, wait: Callable[[], None] | None = None
) -> _Op:
    """Wrap *op*, vLLM's ``swap_blocks_batch`` (the descriptors first), as `begun` says.

    After the op (also one that raised: a part of its copies may have begun), ``end()``
    records the copy's end event: by default a ``torch.Event`` on the current stream.  If
    that raises (a signal, a faulted device), the copy ends once ``wait()`` returned: by
    default once the accelerator finished all its work.
    """
    record_end = _end_event if end is None else end
    unrecorded = _Unrecorded(_wait_for_device if wait is None else wait)

    @functools.wraps(op)
    def swap_blocks_batch(src_ptrs: object, *args: Any, **kwargs: Any) -> Any:
        copy = begun(src_ptrs, _debug.site(False)) if isinstance(src_ptrs, torch.Tensor) else None
        try:
            return op(src_ptrs, *args, **kwargs)
        finally:
            if copy is not None:
                event: Event = unrecorded
                try:
                    event = record_end()
                finally:
                    copy.event = event

    return cast("_Op", swap_blocks_batch)


def _end_event() -> Event:
    """An event recorded now on the current stream; `DONE` on the CPU (its copies are over)."""
    event = torch.Event()
    if getattr(event, "device", None) == _CPU:
        return DONE
    event.record()
    return event


_CPU = torch.device("cpu")


@final
class _Unrecorded:
    """The end of a copy whose end event could not be recorded: *wait* returned."""

    __slots__ = ("wait",)

    def __init__(self, wait: Callable[[], None]) -> None:
        self.wait = wait

    def query(self) -> bool:
        self.wait()  # (blocks: only after a failed recording)
        return True

    def synchronize(self) -> None:
        self.wait()


def _wait_for_device() -> None:
    """Wait until the accelerator, if there is one, finished all its work."""
    accelerator = getattr(torch, "accelerator", None)  # (torch 2.6 and later)
    if accelerator is not None and accelerator.is_available():
        accelerator.synchronize()
    elif torch.cuda.is_available():
        torch.cuda.synchronize()


def early(pool: Any, buffer: Any, pending: list[Any]) -> Exception | None:
    """Report a release made while a copy bucketpool saw could still read (`Copy`).

    Returns the error for the release to raise: strict's `ReleaseError`, or the warning an
    "error" filter turned into one (a with block's own exception keeps precedence).
    """
    copies = [event for event in pending if type(event) is Copy]
    if not copies or len(copies) < len(pending):  # the holder's own pending event covers them
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
        try:
            warnings.warn_explicit(message, InFlightReleaseWarning, *where, module="bucketpool")
        except Warning as raised:  # an "error" filter
            return raised
    return None
