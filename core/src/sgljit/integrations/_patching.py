"""Reversible attribute patches: each (owner, name) keeps the value it had before sgljit's first
patch, so re-applying wraps HF's original (not sgljit's wrapper) and ``revert`` restores it."""

from __future__ import annotations

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


def patch(owner: Any, name: str, value: Any) -> None:
    """Set ``owner.name = value``, remembering the owner's own value (a class attribute it
    inherits is not its own: revert then deletes the patch)."""
    key = (id(owner), name)
    if key not in _saved:
        _saved[key] = (owner, name, vars(owner).get(name, _MISSING))
    setattr(owner, name, value)


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


def require_op(name: str) -> None:
    """Resolve ``sgljit.ops.<name>``: a missing plugin fails when patching, not in a forward."""
    getattr(ops, name)
