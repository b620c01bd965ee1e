"""A torchrun job's heartbeats over a real TCPStore: a rank is dead only when it stopped beating.

A TCPStore client serves one request at a time, whichever thread sends it. Once,
ranks waiting in a blocking ``store.wait`` for a late peer (at a case's start)
could not beat for as long as the peer took, so the late peer took them for
dead and the case was recorded as a hang of a rank that was fine (a CI run of
test_torchrun.py on a loaded machine). These tests use real processes and a
real store, as a job does.
"""

from __future__ import annotations

import multiprocessing
import threading
import time
from datetime import timedelta

import pytest
import torch.distributed as dist

from harness.engine.torchrun_protocol import DEAD_AFTER_S, HEARTBEAT_S, Heartbeats, exchange

LATE_S = 3 * DEAD_AFTER_S  # how late the last rank reaches the exchange


def client(port: int):
    return dist.PrefixStore("job/", dist.TCPStore("127.0.0.1", port, None, False, timedelta(seconds=60)))


def rank_main(port: int, rank: int, world: int, late_rank: int, answer) -> None:
    """Beat as a job's rank does, reach the exchange (``late_rank`` only after ``LATE_S``), and record every
    look at the others that found one dead."""
    store = client(port)
    beats = Heartbeats(store, world)
    stop = threading.Event()
    seen_dead: list[list[int]] = []

    def beat():
        while not stop.is_set():
            beats.beat(rank)
            dead = sorted(set(range(world)) - beats.alive())
            if dead:
                seen_dead.append(dead)
            time.sleep(HEARTBEAT_S)

    t = threading.Thread(target=beat, daemon=True)
    t.start()
    if rank == late_rank:
        time.sleep(LATE_S)
    values = exchange(store, "start", rank, world, str(rank), 30)
    time.sleep(2 * DEAD_AFTER_S)  # the looks right after the exchange matter most
    stop.set()
    t.join(timeout=5)
    answer.put((rank, values, seen_dead))


@pytest.mark.slow(16)
def test_ranks_waiting_for_a_late_peer_keep_beating():
    world, late = 4, 3
    server = dist.TCPStore("127.0.0.1", 0, None, True, timedelta(seconds=60))
    ctx = multiprocessing.get_context("spawn")
    answer = ctx.Queue()
    procs = [ctx.Process(target=rank_main, args=(server.port, r, world, late, answer)) for r in range(world)]
    for p in procs:
        p.start()
    try:
        answers = dict((rank, (values, dead)) for rank, values, dead in (answer.get(timeout=60) for _ in procs))
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
                p.join()
    assert all(values == [str(r) for r in range(world)] for values, _ in answers.values()), answers
    assert {rank: dead for rank, (_, dead) in answers.items() if dead} == {}, "a live rank was taken for dead"


def test_exchange_names_the_ranks_that_never_came():
    server = dist.TCPStore("127.0.0.1", 0, None, True, timedelta(seconds=60))
    store = client(server.port)
    t0 = time.monotonic()
    with pytest.raises(TimeoutError, match=r"'start'.* 1s: ranks 1, 2 did not"):
        exchange(store, "start", 0, 3, "x", 1)
    assert time.monotonic() - t0 < 5


@pytest.mark.slow
def test_an_observer_that_stalled_saw_nothing_of_the_stall():
    """After a gap in this observer's own looks longer than a heartbeat's silence allows, a counter that did not
    move proves nothing yet (its rank may have been stalled with this one): it gets a fresh DEAD_AFTER_S."""
    server = dist.TCPStore("127.0.0.1", 0, None, True, timedelta(seconds=60))
    beats = Heartbeats(client(server.port), 2)
    beats.beat(1)
    assert beats.alive() == {0, 1}
    time.sleep(DEAD_AFTER_S + 0.5)  # this observer was stalled; rank 1 did not beat meanwhile either
    assert beats.alive() == {0, 1}
    end = time.monotonic() + DEAD_AFTER_S + 1
    while 1 in beats.alive():  # looked at every heartbeat, still silent: rank 1 is dead
        assert time.monotonic() < end, "a rank silent under steady looks was never declared dead"
        time.sleep(HEARTBEAT_S)


@pytest.mark.slow
def test_heartbeats_go_on_while_another_thread_blocks_the_jobs_connection():
    """gloo's rendezvous of a new group blocks in a get on the job's store until its peers post: the heartbeat,
    on a connection of its own, is not held behind it."""
    server = dist.TCPStore("127.0.0.1", 0, None, True, timedelta(seconds=60))
    store = client(server.port)
    beats = Heartbeats(store, 1)
    store.set_timeout(timedelta(seconds=3))
    blocked = threading.Thread(target=lambda: pytest.raises(dist.DistStoreError, store.get, "never-posted"))
    blocked.start()
    time.sleep(0.2)
    t0 = time.monotonic()
    beats.beat(0)
    assert time.monotonic() - t0 < 1.0, "the heartbeat waited for another thread's request"
    blocked.join()
    assert beats.alive() == {0}
