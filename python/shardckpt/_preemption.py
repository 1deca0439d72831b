"""Preemption: the scheduler's "stop" turned into one step that every rank agrees on.

Slurm, Kubernetes, torchrun and ``launch/mpirun.sh`` say "stop" with a signal (SIGTERM, or
SIGUSR1 as Slurm's ``--signal`` and mpirun.sh forward it) and kill the job after a grace period.
The signal reaches ranks at different moments, or only some of them, so a rank must not act on
its own signal: it would save a step the others never reach, or wait in a collective they left.
The watcher's handlers only record the signal (in C++, async-signal-safe; the process no longer
dies of it); :meth:`PreemptionWatcher.should_stop`, called by every rank once per step, is one
all-reduce that gives every rank the same answer.
"""
from __future__ import annotations

import dataclasses
import signal as _signal
from typing import Any, Iterable, Optional

from ._comm import resolve
from .errors import raise_for

__all__ = ["PreemptionWatcher", "StopRequest"]


@dataclasses.dataclass(frozen=True)
class StopRequest:
    """The agreed answer of :meth:`PreemptionWatcher.should_stop`, the same on every rank.

    ``signal``: the name of the signal the lowest such rank received ("SIGTERM", "SIGUSR1", "a
    stop request" for :meth:`PreemptionWatcher.request_stop`), "" when none; ``first_rank``: that
    rank (-1 when none); ``seconds_since``: since the earliest reception on any rank, so the
    scheduler's grace period started at least that long ago."""
    requested: bool
    signal: str = ""
    first_rank: int = -1
    seconds_since: float = 0.0

    def __bool__(self) -> bool:
        return self.requested


class PreemptionWatcher:
    """Records SIGTERM and SIGUSR1 (or ``signals``) instead of dying of them, and tells every
    rank, at the same step, whether any rank received one::

        with shardckpt.PreemptionWatcher() as watcher:
            while step < steps:
                train_one_step(); step += 1
                if watcher.should_stop():                     # collective: every rank, every step
                    shardckpt.save(state_dict, root, step)    # the same step on every rank
                    break

    One watcher per process (signal dispositions are per process): a second is refused. A Python
    handler installed with :func:`signal.signal` before it still runs after the recording;
    :meth:`close` (or leaving the ``with`` block) puts the previous handlers back.
    ``should_stop`` takes ``comm`` as :func:`save` does (the job's, by default)."""

    def __init__(self, signals: Iterable[int] = (_signal.SIGTERM, _signal.SIGUSR1)) -> None:
        from . import _core
        code, message, self._watcher = _core.install_watcher([int(s) for s in signals])
        raise_for(code, message)

    def should_stop(self, comm: Any = None) -> StopRequest:
        """Collective: every rank calls it at the same point of the same step."""
        from . import _core
        code, message, out = _core.watcher_should_stop(self._watcher, resolve(comm))
        raise_for(code, message)
        requested, name, first_rank, seconds = out
        return StopRequest(bool(requested), name, int(first_rank), float(seconds))

    def request_stop(self, signal: Optional[int] = None) -> None:
        """As if ``signal`` had arrived on this rank (a time limit of the job's own, a test)."""
        from . import _core
        _core.watcher_request_stop(self._watcher, int(signal or 0))

    def close(self, ignore_late_signals: bool = False) -> None:
        """Puts the previous handlers back; the watcher answers no more. A job that is done
        passes ``ignore_late_signals=True``: the signals are ignored from then on, so that a
        stop the launcher forwards while the process exits does not kill it (the job would end
        with the signal's status though every step and the final checkpoint were done). Ignored
        signals stay ignored in processes started afterwards (exec keeps SIG_IGN): call it last."""
        from . import _core
        _core.watcher_close(self._watcher, bool(ignore_late_signals))

    def __enter__(self) -> "PreemptionWatcher":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
