"""The interception utility: a module global replaced while users are active, restored by the
last one (nesting, exceptions), a context slot private to each thread and task, and an
idempotent permanent install."""

from __future__ import annotations

import asyncio
import sys
import threading
import types
from collections.abc import Callable, Iterator

import pytest

from replayssm_quant import interception

MODULE = "replayssm_test_intercepted_module"
SLOT: interception.ContextSlot[str] = interception.ContextSlot("replayssm_test_slot")


def _square(x: int) -> int:
    return x * x


def _make(original: Callable) -> Callable:
    """Tags the result with the slot's owner while one is active."""

    def wrapper(x: int):
        owner = SLOT.get()
        return original(x) if owner is None else (owner, original(x))

    return wrapper


@pytest.fixture
def module() -> Iterator[types.ModuleType]:
    mod = types.ModuleType(MODULE)
    mod.square = _square
    sys.modules[MODULE] = mod
    yield mod
    del sys.modules[MODULE]


def test_acquire_wraps_and_release_restores(module):
    wrapper = interception.acquire(MODULE, "square", _make)
    assert module.square is wrapper
    assert interception.original(wrapper) is _square
    assert wrapper.__wrapped__ is _square and wrapper.__name__ == "_square"
    assert module.square(3) == 9  # no owner: the original's result
    with SLOT.holding("a"):
        assert module.square(3) == ("a", 9)
    assert module.square(3) == 9
    interception.release(MODULE, "square")
    assert module.square is _square


def test_nested_users_restore_in_any_order(module):
    with interception.intercepted(MODULE, "square", _make) as outer:
        with interception.intercepted(MODULE, "square", _make) as inner:
            assert inner is outer is module.square
        assert module.square is outer  # one user left
    assert module.square is _square
    first = interception.acquire(MODULE, "square", _make)
    interception.acquire(MODULE, "square", _make)
    interception.release(MODULE, "square")
    assert module.square is first
    interception.release(MODULE, "square")
    assert module.square is _square
    interception.release(MODULE, "square")  # one release too many is harmless
    assert module.square is _square


def test_exception_restores_attribute_and_slot(module):
    with pytest.raises(RuntimeError, match="boom"):
        with interception.intercepted(MODULE, "square", _make):
            with SLOT.holding("a"):
                raise RuntimeError("boom")
    assert module.square is _square
    assert SLOT.get() is None


def test_restore_leaves_a_later_replacement_alone(module):
    interception.acquire(MODULE, "square", _make)

    def other(x):
        return -x

    module.square = other
    interception.release(MODULE, "square")
    assert module.square is other


def test_a_second_wrapper_of_one_global_is_refused(module):
    with interception.intercepted(MODULE, "square", _make):
        with pytest.raises(RuntimeError, match="another wrapper"):
            interception.acquire(MODULE, "square", lambda fn: fn)
    assert module.square is _square


def test_missing_target(module):
    with pytest.raises(interception.MissingTarget):
        interception.acquire(MODULE, "cube", _make)
    with pytest.raises(interception.MissingTarget):
        interception.install(MODULE, "cube", _make)


def test_install_is_idempotent_and_reads_the_original_at_call_time(module):
    def make(original):
        def wrapper(x):
            return interception.original(wrapper)(x) + 1

        return wrapper

    first = interception.install(MODULE, "square", make)
    again = interception.install(MODULE, "square", make)
    assert again is first is module.square
    assert interception.original(first) is _square  # not wrapped twice
    assert module.square(3) == 10
    setattr(first, interception.ORIGINAL, lambda x: 0)  # a test substitutes the kernel
    assert module.square(3) == 1


def test_two_threads_see_only_their_own_owner(module):
    start = threading.Barrier(2)
    results: dict[str, list] = {}

    def run(owner: str) -> None:
        with interception.intercepted(MODULE, "square", _make):
            with SLOT.holding(owner):
                start.wait()
                results[owner] = [module.square(i) for i in range(200)]
                start.wait()

    threads = [threading.Thread(target=run, args=(name,)) for name in ("a", "b")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results["a"] == [("a", i * i) for i in range(200)]
    assert results["b"] == [("b", i * i) for i in range(200)]
    assert module.square is _square


def test_two_async_tasks_see_only_their_own_owner(module):
    async def run(owner: str) -> list:
        with SLOT.holding(owner):
            out = []
            for i in range(5):
                await asyncio.sleep(0)
                out.append(module.square(i))
            return out

    async def main() -> list:
        with interception.intercepted(MODULE, "square", _make):
            return await asyncio.gather(run("a"), run("b"))

    a, b = asyncio.run(main())
    assert a == [("a", i * i) for i in range(5)]
    assert b == [("b", i * i) for i in range(5)]


def test_hold_during_forward_sets_the_slot_only_inside_forward():
    import torch

    seen: list = []

    class Probe(torch.nn.Module):
        def forward(self, x):
            seen.append(SLOT.get())
            if x is None:
                raise ValueError("bad input")
            return x

    probe = Probe()
    refused: list = []

    def before(owner: str, kwargs: dict) -> None:
        if kwargs.get("refuse"):
            refused.append(owner)
            raise RuntimeError("refused")

    handles = interception.hold_during_forward(SLOT, [(probe, "p")], before=before)
    probe(torch.ones(1))
    with pytest.raises(ValueError):
        probe(None)
    assert SLOT.get() is None  # the post-hook ran despite the exception
    for h in handles:
        h.remove()
    probe(torch.ones(1))
    assert seen == ["p", "p", None]
    assert refused == []
