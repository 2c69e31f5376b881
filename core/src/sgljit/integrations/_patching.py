"""Reversible attribute patches: each (owner, name) keeps the value it had before sgljit's first
patch, so re-applying wraps HF's original (not sgljit's wrapper) and ``revert`` restores it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .. import ops

_MISSING = object()
_saved: dict[tuple[int, str], tuple[Any, str, Any]] = {}


def original(owner: Any, name: str) -> Any:
    """``owner.name`` as it was before sgljit patched it."""
    saved = _saved.get((id(owner), name))
    if saved is None:
        return getattr(owner, name)
    value = saved[2]
    return getattr(owner, name) if value is _MISSING else value


def patch(owner: Any, name: str, value: Any, was: Any = _MISSING) -> None:
    """Set ``owner.name = value``, remembering the owner's own value (a class attribute it
    inherits is not its own: revert then deletes the patch), or ``was`` where given: what revert
    restores."""
    key = (id(owner), name)
    if key not in _saved:
        _saved[key] = (owner, name, vars(owner).get(name, _MISSING) if was is _MISSING else was)
    setattr(owner, name, value)


_revert_hooks: list[Callable[[], None]] = []


def on_revert(hook: Callable[[], None]) -> None:
    """Run ``hook()`` at the next revert, after the recorded patches are undone: for a patched
    value that spreads where no patch recorded it (modules imported later bind it by name)."""
    if hook not in _revert_hooks:
        _revert_hooks.append(hook)


def is_patched(owner: Any, name: str) -> bool:
    return (id(owner), name) in _saved


def revert() -> None:
    """Undo every patch, newest first."""
    for owner, name, value in reversed(list(_saved.values())):
        if value is _MISSING:
            delattr(owner, name)
        else:
            setattr(owner, name, value)
    _saved.clear()
    hooks = list(_revert_hooks)
    _revert_hooks.clear()
    for hook in hooks:
        hook()


def require_op(name: str) -> None:
    """Resolve ``sgljit.ops.<name>``: a missing plugin fails when patching, not in a forward."""
    getattr(ops, name)
