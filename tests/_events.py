"""A completion event whose completion the test decides, for the tests of parking."""

from __future__ import annotations


class FlagEvent:
    """Done when ``done`` is set; counts the pool's ``query()`` calls."""

    def __init__(self, done: bool = False) -> None:
        self.done = done
        self.queries = 0

    def query(self) -> bool:
        self.queries += 1
        return self.done
