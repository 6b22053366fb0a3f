"""The ``fork`` case: what the pool's fork hooks add to ``os.fork()``.

Two fresh interpreters import bucketpool (and so torch), the same process but for one
thing: one makes a pool, which registers the hooks; the other never does, and forks as a
process without bucketpool would.  Each round asks each in turn to time a pass of forks
(``os.fork()``, ``os._exit(0)`` in the child, ``waitpid`` in the parent), so load that
slows a round slows both.
"""

from __future__ import annotations

import functools
import os
import subprocess
import sys
import typing

import bucketpool
from bench._cases import Series, SeriesCase

__all__ = ["ForkCase", "forks_for"]

#: A worker: makes a pool if it is ``with hooks``, then times each line's count of forks.
_WORKER = """
import gc, os, sys, time, warnings
import bucketpool
if sys.argv[1] == "with hooks":
    bucketpool.BucketPool()
warnings.simplefilter("ignore", DeprecationWarning)  # forking with threads (torch's)
gc.disable()
for line in sys.stdin:
    start = time.perf_counter_ns()
    for _ in range(int(line)):
        if (pid := os.fork()) == 0:
            os._exit(0)
        os.waitpid(pid, 0)
    print(time.perf_counter_ns() - start, flush=True)
"""


def forks_for(ops: int) -> int:
    """The forks in a pass for a run of *ops* steps per pass: 50 in a full run."""
    return max(2, ops // 200)


@typing.final
class ForkCase(SeriesCase):
    """``os.fork()`` in a process with a pool (the hooks registered) over one without."""

    per = "fork"

    def __init__(self, forks: int) -> None:
        super().__init__(
            "fork",
            f"os.fork(), os._exit(0) in the child, waitpid: {forks} per pass, in a process "
            "that made a pool (the fork hooks) vs one that imported bucketpool only",
            [("fork with hooks/without", "with hooks", "without")],
        )
        self._forks = forks
        self._workers: dict[str, subprocess.Popen[str]] = {}

    def make(self) -> dict[str, Series]:
        """Start both workers; a series asks its worker for one pass."""
        root = os.path.dirname(os.path.dirname(os.path.abspath(bucketpool.__file__)))
        path = os.pathsep.join(filter(None, (root, os.environ.get("PYTHONPATH"))))
        for name in ("without", "with hooks"):
            self._workers[name] = subprocess.Popen(
                [sys.executable, "-c", _WORKER, name],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
                env={**os.environ, "PYTHONPATH": path},
            )
        return {name: (functools.partial(self._pass, name), self._forks) for name in self._workers}

    def _pass(self, name: str) -> int:
        worker = self._workers[name]
        print(self._forks, file=worker.stdin, flush=True)
        assert worker.stdout is not None  # (a pipe)
        return int(worker.stdout.readline())

    def close(self) -> None:
        """End both workers."""
        super().close()
        for worker in self._workers.values():
            worker.communicate(timeout=60)  # its stdin closed, it ends
        self._workers = {}
