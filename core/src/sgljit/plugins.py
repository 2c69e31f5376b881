"""Kernel families are separate distributions, found through the ``sgljit.plugins`` entry points.

Each entry point names a small manifest (a dict in the plugin's ``__init__``, which imports nothing
heavy)::

    MANIFEST = {"name": "norm", "version": "0.1.0", "requires_sgljit": ">=0.1,<0.2",
                "ops": {"rmsnorm": "sgljit_norm.ops:rmsnorm"}, "kernel_dirs": ["csrc", "sycl"],
                "prebuild": "sgljit_norm.ops:prebuild_specs"}

Discovery reads manifests only; a plugin's ops module is imported on the first use of one of its ops.
Policy: two plugins claiming one op is an error on use of that op, naming both distributions (no
silent precedence); disable one with ``SGLJIT_DISABLE_PLUGINS=name``. A plugin that fails to load
or needs another sgljit version breaks only its own ops.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import os
from importlib.metadata import entry_points
from typing import Any

from ._version import __version__
from .errors import PluginError

__all__ = ["ENTRY_POINT_GROUP", "Plugin", "discover", "resolve_op"]

ENTRY_POINT_GROUP = "sgljit.plugins"


@dataclasses.dataclass
class Plugin:
    entry_point: str  # the entry point's name
    distribution: str  # e.g. "sgljit-norm 0.1.0"
    manifest: dict[str, Any] | None = None
    error: str | None = None  # why the plugin cannot be used (broken, incompatible)

    @property
    def name(self) -> str:
        return (self.manifest or {}).get("name", self.entry_point)

    @property
    def ops(self) -> dict[str, str]:
        return dict((self.manifest or {}).get("ops", {}))

    @property
    def status(self) -> str:
        return "ok" if self.error is None else self.error


def _disabled() -> set[str]:
    return {n.strip() for n in os.environ.get("SGLJIT_DISABLE_PLUGINS", "").split(",") if n.strip()}


def _check_manifest(manifest: Any) -> str | None:
    if not isinstance(manifest, dict):
        return f"manifest is a {type(manifest).__name__}, expected a dict"
    missing = [k for k in ("name", "version", "ops") if k not in manifest]
    if missing:
        return f"manifest lacks {', '.join(missing)}"
    required = manifest.get("requires_sgljit")
    if required:
        from packaging.specifiers import InvalidSpecifier, SpecifierSet

        try:
            if __version__ not in SpecifierSet(required):
                return f"incompatible: needs sgljit{required}, this is sgljit {__version__}"
        except InvalidSpecifier:
            return f"manifest requires_sgljit {required!r} is not a version specifier"
    return None


@functools.lru_cache(maxsize=1)
def discover() -> tuple[Plugin, ...]:
    """Every installed plugin (disabled ones left out), with its manifest or the reason it is unusable."""
    disabled = _disabled()
    plugins = []
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        if ep.name in disabled:
            continue
        dist = f"{ep.dist.name} {ep.dist.version}" if ep.dist else ep.value
        plugin = Plugin(entry_point=ep.name, distribution=dist)
        try:
            plugin.manifest = ep.load()
            plugin.error = _check_manifest(plugin.manifest)
        except Exception as err:
            plugin.error = f"broken: {type(err).__name__}: {err}"
        if (
            plugin.manifest is not None
            and isinstance(plugin.manifest, dict)
            and plugin.name in disabled
        ):
            continue
        plugins.append(plugin)
    return tuple(plugins)


def op_table() -> dict[str, list[Plugin]]:
    """Op name → the plugins that claim it (one, unless they conflict)."""
    table: dict[str, list[Plugin]] = {}
    for plugin in discover():
        for op in plugin.ops:
            table.setdefault(op, []).append(plugin)
    return table


@functools.cache
def resolve_op(op: str) -> Any:
    """Import and return the function implementing ``op``; errors say which plugin is at fault."""
    claims = op_table().get(op)
    if not claims:
        known = ", ".join(sorted(op_table())) or "none (no plugins installed)"
        raise AttributeError(f"sgljit.ops has no op {op!r}; installed ops: {known}")
    if len(claims) > 1:
        names = " and ".join(p.distribution for p in claims)
        raise PluginError(
            f"op {op!r} is provided by {names}; uninstall one or set "
            f"SGLJIT_DISABLE_PLUGINS to one of: {', '.join(p.entry_point for p in claims)}"
        )
    plugin = claims[0]
    if plugin.error is not None:
        raise PluginError(
            f"op {op!r} is unavailable: plugin {plugin.distribution} is {plugin.error}"
        )
    target = plugin.ops[op]
    module_name, _, attr = target.partition(":")
    try:
        return getattr(importlib.import_module(module_name), attr)
    except Exception as err:
        raise PluginError(
            f"op {op!r}: plugin {plugin.distribution} failed to load {target}: {type(err).__name__}: {err}"
        ) from err


def reset() -> None:
    """Forget discovery results (after installing or removing plugins in a running process)."""
    discover.cache_clear()
    resolve_op.cache_clear()
