"""Completion events whose completion the tests decide, for the tests of parking.

`FlagEvent` and `SyncEvent` are done when told; `ScriptedEvent` answers from a script (and
records whether the pool's lock was held at each question); the `FlipEvent` family is the
stateful model's and the thread tests' (slotted, each with what the model needs to know).
"""

from __future__ import annotations

from bucketpool import _lock


class DeviceError(RuntimeError):
    """What a failing event's ``query()`` raises."""


class FlagEvent:
    """Done when ``done`` is set; counts the pool's ``query()`` calls."""

    def __init__(self, done: bool = False) -> None:
        self.done = done
        self.queries = 0

    def query(self) -> bool:
        self.queries += 1
        return self.done


class SyncEvent(FlagEvent):
    """A `FlagEvent` whose ``synchronize()`` completes it, as a device wait would."""

    def synchronize(self) -> None:
        self.done = True


class ScriptedEvent:
    """An event whose ``query()`` answers from a script, then *after* forever.

    Each answer is True, False or an exception to raise.  ``queries`` counts the questions
    and ``under_lock`` says, for each, whether this thread held the pool's lock then.
    """

    def __init__(self, *script: bool | BaseException, after: bool | BaseException = True) -> None:
        self.script = list(script)
        self.after = after
        self.queries = 0
        self.under_lock: list[bool] = []

    def query(self) -> bool:
        self.queries += 1
        self.under_lock.append(_lock.owned())
        answer = self.script.pop(0) if self.script else self.after
        if isinstance(answer, BaseException):
            raise answer
        return answer


class FlipEvent:
    """A completion event whose ``query()`` reports what the test last set.

    `finish_after` makes it a copy that the device completes once the pool has asked
    *count* more times: a wait that polls must keep asking, whatever the timing.
    """

    __slots__ = ("countdown", "done")

    def __init__(self, done: bool = False) -> None:
        self.done = done
        self.countdown = 0

    def query(self) -> bool:
        if self.countdown:
            self.countdown -= 1
            self.done = self.done or not self.countdown
        return self.done

    def finish_after(self, count: int) -> None:
        """Report done from the *count*-th question on (1: the next one)."""
        self.countdown = count

    @property
    def settled(self) -> bool:
        """Whether ``query()`` reports done now, without raising."""
        return self.done

    @property
    def raising(self) -> bool:
        """Whether the next ``query()`` raises."""
        return False

    def finish(self) -> None:
        """Complete the copy (and, for a failing event, recover the device)."""
        self.done = True


class DeviceHalt(BaseException):
    """What a failing event's ``query()`` raises when it is not an `Exception` at all."""


#: Every error a test's failing events raise.
EVENT_ERRORS = (DeviceError, DeviceHalt)


class RaisingEvent(FlipEvent):
    """An event whose ``query()`` raises *raises* times (-1: until finished), then reports.

    It raises a `DeviceError`, or with *halt* a `DeviceHalt` (a `BaseException`).
    """

    __slots__ = ("halt", "raises")

    def __init__(self, done: bool = False, raises: int = 1, halt: bool = False) -> None:
        super().__init__(done)
        self.raises = raises
        self.halt = halt

    def query(self) -> bool:
        if self.raises:
            self.raises -= self.raises > 0
            if self.halt:
                raise DeviceHalt("query failed: driver halted")
            raise DeviceError("query failed: device lost")
        return super().query()

    @property
    def settled(self) -> bool:
        return self.done and not self.raises

    @property
    def raising(self) -> bool:
        return self.raises != 0

    def finish(self) -> None:
        self.done = True
        self.raises = 0


class WaitableFlipEvent(FlipEvent):
    """A `FlipEvent` whose ``synchronize()`` completes it, as a device wait would."""

    __slots__ = ()

    def synchronize(self) -> None:
        self.done = True


class NoQuery:
    """Not an event: ``query`` is missing."""
