"""How a host collective waits for gloo (torch_xla/_internal/collectives.py, _Group.run): a short
timed wait first, the arrival recorded in the store only when it runs out, then a full wait. Checked
here in one process with stand-ins for gloo's Work and the store (the multi-process behaviour is in
tests/test_distributed.py): the work finishing right after the short wait timed out (a race seen
under load) is a success, not an error; gloo's own error still raises, naming the op."""
import threading
import time

import pytest
import torch

from torch_xla._internal import collectives as C
from torch_xla._internal import world


class _Store:
    def __init__(self):
        self.kv = {}

    def set(self, k, v):
        self.kv[k] = v.encode() if isinstance(v, str) else v

    def get(self, k):
        return self.kv[k]

    def check(self, keys):
        return all(k in self.kv for k in keys)


class _Work:
    """wait(timeout) raises like c10d's Work::wait does when it runs out; `done_after` seconds after
    creation the work completes (with `error` if given)."""

    def __init__(self, done_after, error=None, complete_on_timeout=False):
        self.t0 = time.monotonic()
        self.done_after = done_after
        self.error = error
        self.complete_on_timeout = complete_on_timeout
        self.timed_out = False

    def is_completed(self):
        return self.timed_out and self.complete_on_timeout or time.monotonic() - self.t0 >= self.done_after

    def wait(self, timeout=None):
        if timeout is not None and not self.is_completed():
            time.sleep(timeout.total_seconds())
            self.timed_out = True
            raise RuntimeError("Operation timed out!")
        while not self.is_completed():
            time.sleep(0.001)
        if self.error:
            raise RuntimeError(self.error)
        return True


def _group(members=(0, 1)):
    g = object.__new__(C._Group)
    g.members, g.size, g.rank, g.key, g.seq = members, len(members), 0, "world", 0
    g.store, g.timeout, g.pg = _Store(), 5.0, None
    g._watching, g._watch_cv, g._watcher = None, threading.Condition(), None
    return g


def test_fast_collective_records_nothing():
    g = _group()
    g.run("all_reduce", lambda pg: _Work(0))
    assert g.seq == 1 and g.store.kv == {}


def test_slow_collective_records_its_arrival():
    g = _group()
    g.run("all_reduce", lambda pg: _Work(0.1))
    assert g.store.kv == {"arr/world/0": b"1"}


def test_completing_just_after_the_short_wait_is_a_success():
    g = _group()
    g.run("all_reduce", lambda pg: _Work(10, complete_on_timeout=True))  # must not raise
    assert g.seq == 1


def test_gloo_error_raises_naming_the_op_and_the_absent_rank():
    g = _group()
    with pytest.raises(world.CollectiveTimeoutError, match=r"all_reduce#1.*rank\(s\) \[1\] did not arrive.*peer gone"):
        g.run("all_reduce", lambda pg: _Work(0.05, error="peer gone"))
    assert g.store.kv["arr/world/0"] == b"1"


def test_send_recv_exchange_is_recorded_by_the_watcher():
    g = _group()

    def steps(pg):
        _Work(0.15).wait()

    g.run_steps("all_reduce", steps)
    deadline = time.monotonic() + 2
    while "arr/world/0" not in g.store.kv and time.monotonic() < deadline:
        time.sleep(0.01)
    assert g.store.kv["arr/world/0"] == b"1"
    g.run_steps("all_reduce", lambda pg: None)  # fast: nothing new recorded
    time.sleep(0.1)
    assert g.store.kv["arr/world/0"] == b"1"
