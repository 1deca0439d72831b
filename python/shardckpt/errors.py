"""Exceptions: one class per engine error kind, each carrying the engine's message.

Every collective call raises the same class with the same message on every rank (the engine
agrees on a status before it returns), so ``except shardckpt.DataLoss`` works in SPMD code.
"""

from __future__ import annotations

from typing import Dict, Type


class ShardckptError(Exception):
    """Base class of every shardckpt error. ``code`` names the kind, ``message`` is the engine's
    text (it names the file, tensor or rank)."""

    code = "Unknown"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def __str__(self) -> str:
        # The message alone, as Python's own exceptions do: a traceback already names the class
        # ("shardckpt.DataLoss: ..."), and "%s" % error in a log line reads the same on every kind.
        return self.message


class InvalidArgument(ShardckptError, ValueError):
    """The caller's input is wrong: a bad layout, name, dtype or shape, an unsupported value."""
    code = "InvalidArgument"


class NotFound(ShardckptError, LookupError):
    """A file, entry or checkpoint does not exist (also: a key a strict load cannot find)."""
    code = "NotFound"


class AlreadyExists(ShardckptError):
    """A checkpoint of that step is committed already."""
    code = "AlreadyExists"


class DataLoss(ShardckptError):
    """Bytes on disk are corrupt or truncated (a checksum or size does not match)."""
    code = "DataLoss"


class IoError(ShardckptError, OSError):
    """The operating system refused an I/O call."""
    code = "IoError"


class NoSpace(IoError):
    """The disk or quota is full (ENOSPC, EDQUOT)."""
    code = "NoSpace"


class FailedPrecondition(ShardckptError):
    """The state is wrong for the call (a lock is held, MPI was finalized)."""
    code = "FailedPrecondition"


class Unimplemented(ShardckptError, NotImplementedError):
    """Not supported by this build or version."""
    code = "Unimplemented"


class Internal(ShardckptError):
    """A bug in shardckpt."""
    code = "Internal"


class Aborted(ShardckptError):
    """Another rank failed and this one stopped with it."""
    code = "Aborted"


class DeadlineExceeded(ShardckptError, TimeoutError):
    """A collective timed out waiting for a rank (SHARDCKPT_COLLECTIVE_TIMEOUT_S)."""
    code = "DeadlineExceeded"


# Tracebacks name the classes where users import them from.
for _cls in (ShardckptError, InvalidArgument, NotFound, AlreadyExists, DataLoss, IoError, NoSpace,
             FailedPrecondition, Unimplemented, Internal, Aborted, DeadlineExceeded):
    _cls.__module__ = "shardckpt"

ERRORS: Dict[str, Type[ShardckptError]] = {
    cls.code: cls
    for cls in (InvalidArgument, NotFound, AlreadyExists, DataLoss, IoError, NoSpace,
                FailedPrecondition, Unimplemented, Internal, Aborted, DeadlineExceeded)
}


def raise_for(code: str, message: str) -> None:
    """Raises the class of ``code`` with ``message``; does nothing for ``"OK"``."""
    if code == "OK":
        return
    raise ERRORS.get(code, ShardckptError)(message)
