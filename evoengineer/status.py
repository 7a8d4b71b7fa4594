"""The verdicts a candidate can get (a foundation module: the store, the evaluators and the search share them).

`Status` is a str enum: a member equals its value (``Status.OK == "ok"``), so the store and elite.json keep plain
strings and a stored verdict compares with a member as it is.
"""

from __future__ import annotations

from enum import Enum


class Status(str, Enum):
    OK = "ok"  # correct, timed
    COMPILE_ERROR = "compile_error"  # the template did not render or the compiler refused it
    GATE_FAILED = "gate_failed"  # the static gate (ptxas report: spills, registers, shared memory) turned it away
    BUILD_ERROR = "build_error"  # the build failed otherwise (the family binding, a loader, the toolchain)
    LINK_ERROR = "link_error"  # built, but the module or cubin did not load
    RUNTIME_ERROR = "runtime_error"  # it crashed, raised or returned an error status
    TIMEOUT = "timeout"  # it hung (the measuring process was replaced)
    WRONG = "wrong"  # an output off the reference, NaN/Inf, a touched input, a write past an output, ...
    SANITIZER_ERROR = "sanitizer_error"  # compute-sanitizer found fault with it before it was published
    SKIPPED = "skipped"  # not evaluated
    STATE_CHANGED = "state_changed"  # it changed the measuring process's or device's state (restored; never an elite)
    # its time cannot be honest: faster than the device allows, work off the timed stream, a graph or new-input time
    # far from its eager time
    IMPLAUSIBLE = "implausible"

    def __str__(self) -> str:  # the value, as a plain string would print (f-strings, joins, logs)
        return self.value

    __format__ = str.__format__


STATUSES = tuple(s.value for s in Status)
