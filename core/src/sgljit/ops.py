"""``sgljit.ops.<name>``: every op of every installed plugin, imported on first use.

>>> import sgljit
>>> "rmsnorm" in dir(sgljit.ops)  # doctest: +SKIP
True
"""

from __future__ import annotations

from typing import Any

from .plugins import op_table, resolve_op


def __getattr__(name: str) -> Any:
    if name.startswith("__"):
        raise AttributeError(name)
    fn = resolve_op(name)
    globals()[name] = fn  # later lookups are plain attribute reads
    return fn


def __dir__() -> list[str]:
    return sorted(op_table())
