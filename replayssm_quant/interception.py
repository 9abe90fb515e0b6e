"""Replacing a module-level function while a context is active.

Hugging Face's hybrid mixers and vLLM's SSM layers call their scans and state updates through
module globals (``modeling_nemotron_h.mamba2_chunk_scan``, ``mamba_mixer2.selective_state_update``
and the like), so replacing that module attribute is the one way in that leaves the model's own
``forward`` untouched. Three users do it (the drift patch, the replay decoder and the vLLM hooks),
and all need the same guarantees, kept here once:

- **The replacement acts only while a context is active.** A :class:`ContextSlot` (a
  :class:`~contextvars.ContextVar`) says which user, if any, owns the current call; the wrapper
  calls the original unchanged when the slot is empty. A ContextVar is per thread and per asyncio
  task, so two threads (or tasks) running different models or configs never see each other's
  state.
- **Refcounted install** (:func:`acquire` / :func:`release`, or :func:`intercepted`): the first
  user wraps the attribute, the last one restores it, so nested or overlapping users (two
  patches of one model, a patch inside a decoder) restore correctly whatever order they exit in,
  exceptions included. A restore never clobbers an attribute someone else replaced since.
- **Idempotent permanent install** (:func:`install`): vLLM loads its general plugins once per
  process, but the plugin's registration may run more than once; a global that already carries
  one of these wrappers is left as is, so it is never wrapped twice.

The original sits on the wrapper under :data:`ORIGINAL` and is looked up there at call time by
:func:`original`, so a test can substitute the function behind an installed wrapper.

This module imports nothing else from the package: every layer above may use it.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import importlib
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

__all__ = [
    "ORIGINAL",
    "ContextSlot",
    "MissingTarget",
    "acquire",
    "hold_during_forward",
    "install",
    "intercepted",
    "is_wrapper",
    "original",
    "release",
]

T = TypeVar("T")
MakeWrapper = Callable[[Callable], Callable]
"""``make(original) -> wrapper``: builds the replacement of one module function."""

ORIGINAL = "__replayssm_quant_original__"
"""Attribute of a wrapper made here that holds the function it replaced."""


class MissingTarget(AttributeError):
    """The module has no attribute of that name (the upstream library changed)."""


class ContextSlot(Generic[T]):
    """Which user owns the calls of the current thread / asyncio task (``None``: nobody)."""

    def __init__(self, name: str) -> None:
        self._var: contextvars.ContextVar[T | None] = contextvars.ContextVar(name, default=None)

    def get(self) -> T | None:
        return self._var.get()

    def set(self, value: T) -> contextvars.Token:
        return self._var.set(value)

    def reset(self, token: contextvars.Token) -> None:
        self._var.reset(token)

    @contextlib.contextmanager
    def holding(self, value: T) -> Iterator[None]:
        """``value`` owns the calls made inside the block."""
        token = self._var.set(value)
        try:
            yield
        finally:
            self._var.reset(token)


def original(wrapper: Callable) -> Callable:
    """The function behind a wrapper made here (``wrapper`` itself if it is not one)."""
    return getattr(wrapper, ORIGINAL, wrapper)


def is_wrapper(fn: Any) -> bool:
    return getattr(fn, ORIGINAL, None) is not None


def _target(module_name: str, name: str) -> tuple[Any, Callable]:
    module = importlib.import_module(module_name)
    fn = getattr(module, name, None)
    if fn is None:
        raise MissingTarget(f"{module_name} has no attribute {name!r}")
    return module, fn


def _wrap(fn: Callable, make: MakeWrapper) -> Callable:
    wrapper = make(fn)
    functools.update_wrapper(wrapper, fn)
    setattr(wrapper, ORIGINAL, fn)
    return wrapper


# ------------------------------------------------------------------------- refcounted install
@dataclass
class _Installed:
    make: MakeWrapper
    original: Callable
    wrapper: Callable
    users: int


_LOCK = threading.Lock()
_INSTALLED: dict[tuple[str, str], _Installed] = {}


def acquire(module_name: str, name: str, make: MakeWrapper) -> Callable:
    """Replace ``module_name.name`` by ``make(original)`` for one more user; returns the wrapper.

    Raises :class:`MissingTarget` if the module has no such attribute, and ``RuntimeError`` if
    another ``make`` holds it now (two different wrappers of one global would shadow each other).
    """
    key = (module_name, name)
    with _LOCK:
        entry = _INSTALLED.get(key)
        if entry is not None:
            if entry.make is not make:
                raise RuntimeError(f"{module_name}.{name} is intercepted by another wrapper")
            entry.users += 1
            return entry.wrapper
        module, fn = _target(module_name, name)
        wrapper = _wrap(fn, make)
        setattr(module, name, wrapper)
        _INSTALLED[key] = _Installed(make, fn, wrapper, 1)
        return wrapper


def release(module_name: str, name: str) -> None:
    """One user less; the last one puts the original back (unless the attribute was replaced
    by someone else in the meantime, which is then left alone)."""
    key = (module_name, name)
    with _LOCK:
        entry = _INSTALLED.get(key)
        if entry is None:
            return
        entry.users -= 1
        if entry.users > 0:
            return
        module = importlib.import_module(module_name)
        if getattr(module, name, None) is entry.wrapper:
            setattr(module, name, entry.original)
        del _INSTALLED[key]


@contextlib.contextmanager
def intercepted(module_name: str, name: str, make: MakeWrapper) -> Iterator[Callable]:
    """:func:`acquire` for the block, :func:`release` after it (exceptions included)."""
    wrapper = acquire(module_name, name, make)
    try:
        yield wrapper
    finally:
        release(module_name, name)


# ------------------------------------------------------------------------- permanent install
def install(module_name: str, name: str, make: MakeWrapper) -> Callable:
    """Replace ``module_name.name`` by ``make(original)`` for the rest of the process, unless it
    already is one of these wrappers (idempotent); returns the installed wrapper."""
    with _LOCK:
        module, fn = _target(module_name, name)
        if is_wrapper(fn):
            return fn
        wrapper = _wrap(fn, make)
        setattr(module, name, wrapper)
        return wrapper


# ------------------------------------------------------------------------- per-module ownership
def hold_during_forward(slot: ContextSlot[T], owners: Iterable[tuple[Any, T]], *,
                        before: Callable[[T, dict], None] | None = None) -> list:
    """For each ``(module, value)``: ``slot`` holds ``value`` while ``module``'s forward runs.

    Uses forward pre-hooks and post-hooks (``always_call``, so an exception restores the slot).
    ``before(value, forward_kwargs)`` runs first and may raise to refuse a call. Returns the hook
    handles; remove them to stop.
    """
    handles: list = []
    tokens: list[contextvars.Token] = []

    def make_pre(value: T) -> Callable:
        def pre(module: Any, args: tuple, kwargs: dict) -> None:
            if before is not None:
                before(value, kwargs)
            tokens.append(slot.set(value))

        return pre

    def post(module: Any, args: tuple, output: Any) -> None:
        if tokens:
            slot.reset(tokens.pop())

    try:
        for module, value in owners:
            handles.append(module.register_forward_pre_hook(make_pre(value), with_kwargs=True))
            handles.append(module.register_forward_hook(post, always_call=True))
    except BaseException:
        for h in handles:
            h.remove()
        raise
    return handles
