"""One cluster for every test process: the first holder brings it up, the last one down."""

from __future__ import annotations

import threading
import time
from contextlib import AbstractContextManager
from pathlib import Path

import pytest
from tests.integration.slurm.cluster import shared


class Resource:
    """A stand-in for the cluster that records what was done to it."""

    def __init__(self, *, running: bool = False) -> None:
        self.running = running
        self.calls: list[str] = []
        self.fail_next_up = False

    def is_up(self) -> bool:
        return self.running

    def up(self) -> None:
        self.calls.append("up")
        if self.fail_next_up:
            self.fail_next_up = False
            raise RuntimeError("up failed")
        self.running = True

    def down(self) -> None:
        self.calls.append("down")
        self.running = False

    def hold(self, root: Path) -> AbstractContextManager[None]:
        return shared(root, "res", is_up=self.is_up, up=self.up, down=self.down)


def test_the_last_holder_tears_down(tmp_path: Path) -> None:
    res = Resource()
    with res.hold(tmp_path):
        with res.hold(tmp_path):
            assert res.calls == ["up"]
        assert res.running, "the first holder still uses it"
    assert res.calls == ["up", "down"] and not res.running


def test_a_later_holder_brings_it_up_again(tmp_path: Path) -> None:
    res = Resource()
    with res.hold(tmp_path):
        pass
    with res.hold(tmp_path):
        assert res.running
    assert res.calls == ["up", "down", "up", "down"]


def test_a_resource_that_was_up_stays_up(tmp_path: Path) -> None:
    res = Resource(running=True)
    with res.hold(tmp_path), res.hold(tmp_path):
        pass
    assert res.calls == ["up"] and res.running


def test_a_failed_bring_up_holds_nothing(tmp_path: Path) -> None:
    res = Resource()
    res.fail_next_up = True
    with pytest.raises(RuntimeError), res.hold(tmp_path):
        pass
    with res.hold(tmp_path):
        assert res.running
    assert res.calls == ["up", "up", "down"]


def test_concurrent_holders_never_see_it_down(tmp_path: Path) -> None:
    """Holders in parallel (each locks the state file on its own, as worker processes do):
    the resource is up whenever one of them holds it, and goes down once, at the end."""
    res = Resource()
    seen_down: list[int] = []
    start = threading.Barrier(6)

    def worker(index: int) -> None:
        start.wait()
        for _ in range(5):
            with res.hold(tmp_path):
                for _ in range(3):
                    if not res.running:
                        seen_down.append(index)
                    time.sleep(0.001)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert seen_down == []
    assert res.calls[-1] == "down" and not res.running
    assert res.calls.count("up") == res.calls.count("down")
