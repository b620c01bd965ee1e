"""The key-value protocol of a torchrun job: the keys its ranks exchange, and its heartbeats.

The harness's own messages go through the job's key-value store (the one
``init_process_group`` joined), never through the process group: a rank
stuck in the implementation's collective cannot block them. Keys live under
``syncbn-harness/``:

    avail/<r>               rank r's unavailable implementations (JSON name -> reason), before any case
    heartbeat/<r>           a counter rank r's watchdog thread bumps four times a second: a counter that
                            stops moving is a dead process
    <n>/result/<r>          rank r's RankResult for the n-th case (JSON), posted when its task returns
    <n>/calls/<r>           the collectives rank r issued so far in the n-th case (JSON), posted by its
                            watchdog while its task does not return, whenever they changed
    <n>/silent/<r>          rank r's stack dump, posted by its watchdog while its task does not return
    <n>/dump-request        a rank wants the silent ranks' stacks: every rank whose task has not returned
                            posts silent/<r> at once
    <n>/written             a counter: the first to add 1 writes the case's record (no record twice)
    <n>/done                "continue" (the next case may start) or "abort" (the job ends)
    end/<r>                 rank r ran every case; every rank waits for all before the group is destroyed
    gone/<r>                rank r destroyed its group; every rank waits (briefly) for all before it exits

Protocol: :class:`Heartbeats` over the whole job, one :class:`CaseKeys` per
case (numbered from 1 in the order every rank runs them), and
:func:`exchange` for the values every rank posts once and reads from all.
The timing constants below are the job's: how often ranks beat and poll,
how long a silent heartbeat takes to mean a dead process, and how long ranks
get to post their stacks. When a failure's silent peers count as stuck is the
waiting rule's (:mod:`harness.engine.waiting`, shared with the local pool).
"""

from __future__ import annotations

import json
import threading
import time
from typing import Optional

PREFIX = "syncbn-harness/"
HEARTBEAT_S = 0.25
DEAD_AFTER_S = 1.5  # a heartbeat unchanged this long: the process is gone
OBSERVER_GAP_S = DEAD_AFTER_S / 3  # an observer whose looks were further apart saw nothing of that gap
DUMP_GRACE_S = 2.5  # after a dump request, how long ranks get to post their stacks
POLL_S = 0.05


class Heartbeats:
    """Every rank's heartbeat counter in the store, and when each last moved (as seen from here).

    The counters go over a connection of their own (``store.clone()``, where the torch build has it): a
    store client serves one request at a time, and the job's own connection may be held for long by a
    blocking request of the main thread (gloo's rendezvous of a new group waits there for its peers).
    """

    def __init__(self, store, world: int):
        self.store = store.clone() if hasattr(store, "clone") else store
        self.world = world
        start = time.monotonic()
        self._seen = {r: (None, start) for r in range(world)}
        self._looked = start  # when this observer's last look ended
        self._lock = threading.Lock()

    def beat(self, rank: int) -> None:
        self.store.add(f"{PREFIX}heartbeat/{rank}", 1)

    def alive(self) -> set[int]:
        """Ranks whose counter moved within ``DEAD_AFTER_S`` (a rank not yet seen long enough counts as alive).

        Silence counts only while this observer looks: after a gap in its own looks longer than
        ``OBSERVER_GAP_S`` (its process stalled, as a loaded machine's peers may have been too), a counter
        that did not move proves nothing yet, and its silence is timed afresh.
        """
        with self._lock:
            now = time.monotonic()
            stalled = now - self._looked > OBSERVER_GAP_S
            for r in range(self.world):
                value = self.store.add(f"{PREFIX}heartbeat/{r}", 0)
                if value != self._seen[r][0] or stalled:
                    self._seen[r] = (value, now)
            self._looked = time.monotonic()
            return {r for r, (_, moved) in self._seen.items() if now - moved < DEAD_AFTER_S}

    def writer(self, me: int) -> int:
        """Rank 0 while it lives, else the lowest live rank."""
        live = self.alive() | {me}
        return 0 if 0 in live else min(live)


def exchange(store, name: str, rank: int, world: int, value: str, timeout_s: float) -> list[str]:
    """Post ``value`` under ``name/<rank>`` and return every rank's, in rank order (waits ``timeout_s`` at most).

    It polls rather than calling ``store.wait``: a store client serves one request at a time, whichever
    thread sends it, so a blocking wait would hold this rank's heartbeat for as long as the last rank takes
    to arrive, and a peer would take this rank for dead.
    """
    store.set(f"{PREFIX}{name}/{rank}", value)
    keys = [f"{PREFIX}{name}/{r}" for r in range(world)]
    end = time.monotonic() + timeout_s
    while not store.check(keys):
        if time.monotonic() >= end:
            missing = ", ".join(str(r) for r, k in enumerate(keys) if not store.check([k]))
            raise TimeoutError(f"the job's ranks did not all reach '{name}' within {timeout_s:g}s: "
                               f"ranks {missing} did not (see their own output for why)")
        time.sleep(POLL_S)
    return [store.get(k).decode() for k in keys]


class CaseKeys:
    """The keys of the n-th case of the job (see the module docstring)."""

    def __init__(self, store, seq: int, world: int):
        self.store, self.seq, self.world = store, seq, world
        self.prefix = f"{PREFIX}{seq}/"

    def _key(self, what: str, rank: Optional[int] = None) -> str:
        return self.prefix + what + ("" if rank is None else f"/{rank}")

    def claim_record(self) -> bool:
        """True for the first caller, in the whole job, to write this case's record."""
        return self.store.add(self._key("written"), 1) == 1

    def set(self, what: str, rank: int, value: str) -> None:
        self.store.set(self._key(what, rank), value)

    def get(self, what: str, rank: Optional[int] = None) -> Optional[str]:
        key = self._key(what, rank)
        if not self.store.check([key]):
            return None
        return self.store.get(key).decode()

    def set_done(self, value: str) -> None:
        self.store.set(self._key("done"), value)

    def request_dumps(self) -> None:
        self.store.set(self._key("dump-request"), "1")

    def results(self) -> dict[int, Optional[dict]]:
        """Every rank's posted result (None: not posted)."""
        return {r: (json.loads(raw) if (raw := self.get("result", r)) is not None else None)
                for r in range(self.world)}
