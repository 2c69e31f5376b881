"""Kernel families are separate distributions, found through the ``sgljit.plugins`` entry points.

Each entry point names a small :class:`Manifest` (a dict in the plugin's ``__init__``, which
imports nothing heavy)::

    MANIFEST: Manifest = {"name": "norm", "version": "0.1.0", "requires_sgljit": ">=0.1,<0.2",
                          "ops": {"rmsnorm": "sgljit_norm.ops:rmsnorm"},
                          "family": "sgljit_norm.ops:family"}

Discovery reads manifests only; a plugin's ops module is imported on the first use of one of its ops.
Policy: two plugins claiming one op is an error on use of that op, naming both distributions (no
silent precedence); disable one with ``SGLJIT_DISABLE_PLUGINS=name``. A plugin that fails to load
or needs another sgljit version breaks only its own ops.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import importlib
import json
import os
import re
import sys
from typing import Any, TypedDict

from ._version import __version__
from .errors import PluginError

__all__ = [
    "ENTRY_POINT_GROUP",
    "KNOWN_OPS",
    "Manifest",
    "Plugin",
    "discover",
    "load_target",
    "resolve_op",
]

ENTRY_POINT_GROUP = "sgljit.plugins"

# The ops of the project's own plugins -> the distribution that provides each: what the error for
# an op that is not installed tells the user to install (tests/core/test_plugins.py checks it
# against the plugins' manifests).
KNOWN_OPS = {
    **dict.fromkeys(
        (
            "rmsnorm",
            "fused_add_rmsnorm",
            "gemma_rmsnorm",
            "gemma_fused_add_rmsnorm",
            "qknorm",
            "qknorm_across_heads",
            "rmsnorm_quant_fp8",
            "fused_add_rmsnorm_quant_fp8",
            "layernorm",
            "layernorm_quant_fp8",
        ),
        "sgljit-norm",
    ),
    **dict.fromkeys(
        (
            "apply_rope",
            "apply_rope_with_kv_cache",
            "qknorm_rope",
            "qknorm_rope_theta",
            "rope_quantize_fp8",
            "rope_quantize_fp8_append_paged_kv_cache",
            "append_paged_kv_cache",
            "append_paged_mla_kv_cache",
        ),
        "sgljit-rope",
    ),
    **dict.fromkeys(
        (
            "per_tensor_quant_fp8",
            "per_token_quant_fp8",
            "per_token_group_quant_fp8",
            "per_token_group_quant_int8",
            "per_token_group_quant_masked",
            "per_token_group_quant_sorted",
        ),
        "sgljit-quant-fp8",
    ),
    "timestep_embedding": "sgljit-timestep-embedding",
    **dict.fromkeys(
        (
            "silu_and_mul",
            "gelu_and_mul",
            "gelu_tanh_and_mul",
            "silu_and_mul_per_token_group_quant_fp8",
            "gated_act_filtered",
        ),
        "sgljit-activation",
    ),
}


def known_distributions() -> list[str]:
    """The project's plugin distributions (``pip install`` names), sorted."""
    return sorted(set(KNOWN_OPS.values()))


def install_hint(distributions: list[str]) -> str:
    """How to install the project's plugin distributions: they are not on a package index, so
    from a checkout (their folders) or from a wheelhouse (``pip wheel``'s, see the README).

    >>> install_hint(["sgljit-quant-fp8"])
    'from a checkout: pip install ./plugins/quant_fp8; from a wheelhouse: pip install --find-links WHEELHOUSE sgljit-quant-fp8'
    """
    folders = " ".join(
        f"./plugins/{d.removeprefix('sgljit-').replace('-', '_')}" for d in distributions
    )
    return (
        f"from a checkout: pip install {folders}; from a wheelhouse: pip install --find-links "
        f"WHEELHOUSE {' '.join(distributions)}"
    )


class _ManifestRequired(TypedDict):
    name: str  # the family's short name ("norm"): `sgljit build --plugin`, SGLJIT_DISABLE_PLUGINS
    version: str  # the distribution's version
    ops: dict[str, str]  # public op name -> "package.module:function" (imported on first use)


class Manifest(_ManifestRequired, total=False):
    """What a plugin's entry point names. ``requires_sgljit``: a version specifier of the core it
    works with (">=0.1,<0.2"); ``family``: "package.module:attr" of its :class:`sgljit.op.Family`
    (prebuilds for ``sgljit build``, cases for ``sgljit check`` and the conformance suite)."""

    requires_sgljit: str
    family: str


@dataclasses.dataclass
class Plugin:
    entry_point: str  # the entry point's name
    distribution: str  # e.g. "sgljit-norm 0.1.0"
    manifest: dict[str, Any] | None = None
    error: str | None = None  # why the plugin cannot be used (broken, incompatible)

    @property
    def name(self) -> str:
        name = self.manifest.get("name") if isinstance(self.manifest, dict) else None
        return name if isinstance(name, str) else self.entry_point

    @property
    def ops(self) -> dict[str, str]:
        """Op name → "module:function"; none for a manifest _check_manifest refuses."""
        ops = self.manifest.get("ops") if isinstance(self.manifest, dict) else None
        return dict(ops) if _is_op_table(ops) else {}

    @property
    def status(self) -> str:
        return "ok" if self.error is None else self.error


def _path_signature() -> list[list]:
    """sys.path entries with their modification times: installing or removing a distribution
    changes the folder that holds its metadata, so an unchanged signature means unchanged entry points."""
    sig = []
    for entry in sys.path:
        try:
            sig.append([entry, os.stat(entry or ".").st_mtime_ns])
        except OSError:
            sig.append([entry, None])
    return sig


def _entry_points() -> list[list[str]]:
    """[name, value, distribution] of every ``sgljit.plugins`` entry point.

    Scanning every installed distribution's metadata costs tens of milliseconds (and importing
    importlib.metadata as much again), so the result is memoized on disk by the path signature.
    """
    from .cache import cache_root

    sig = _path_signature()
    digest = hashlib.sha256(json.dumps([sys.version, sig]).encode()).hexdigest()[:16]
    memo = cache_root() / "plugins" / f"entry-points-{digest}.json"
    try:
        data = json.loads(memo.read_text())
        if data["signature"] == sig:
            return data["entry_points"]
    except (OSError, ValueError, KeyError):
        pass
    from importlib.metadata import entry_points

    found = [
        [ep.name, ep.value, f"{ep.dist.name} {ep.dist.version}" if ep.dist else ep.value]
        for ep in entry_points(group=ENTRY_POINT_GROUP)
    ]
    try:
        memo.parent.mkdir(parents=True, exist_ok=True)
        tmp = memo.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps({"signature": sig, "entry_points": found}))
        os.replace(tmp, memo)
    except OSError:
        pass  # a read-only cache: discovery still works, only slower
    return found


def load_target(value: str) -> Any:
    """The object a ``"package.module:attr"`` string names (entry points, manifests' op targets)."""
    module, _, attr = value.partition(":")
    obj = importlib.import_module(module.strip())
    for part in attr.strip().split(".") if attr.strip() else ():
        obj = getattr(obj, part)
    return obj


_SIMPLE_SPEC = re.compile(r"^\s*(>=|<=|==|!=|>|<)\s*(\d+(?:\.\d+)*)\s*$")


def _version_tuple(v: str) -> tuple[int, ...]:
    parts = tuple(int(p) for p in v.split("."))
    return parts + (0,) * (4 - len(parts))


def _satisfies(version: str, required: str) -> bool:
    """Whether ``version`` meets a specifier like ">=0.1,<0.2" (packaging for anything fancier)."""
    clauses = [_SIMPLE_SPEC.match(c) for c in required.split(",")]
    if all(clauses) and re.fullmatch(r"\d+(\.\d+)*", version):
        have = _version_tuple(version)
        ops = {
            ">=": lambda a, b: a >= b,
            "<=": lambda a, b: a <= b,
            "==": lambda a, b: a == b,
            "!=": lambda a, b: a != b,
            ">": lambda a, b: a > b,
            "<": lambda a, b: a < b,
        }
        return all(ops[m.group(1)](have, _version_tuple(m.group(2))) for m in clauses)
    from packaging.specifiers import SpecifierSet

    return version in SpecifierSet(required)


def _disabled() -> set[str]:
    return {n.strip() for n in os.environ.get("SGLJIT_DISABLE_PLUGINS", "").split(",") if n.strip()}


def _is_op_table(ops: Any) -> bool:
    return isinstance(ops, dict) and all(
        isinstance(k, str) and isinstance(v, str) for k, v in ops.items()
    )


def _check_manifest(manifest: Any) -> str | None:
    if not isinstance(manifest, dict):
        return f"manifest is a {type(manifest).__name__}, expected a dict"
    missing = [k for k in ("name", "version", "ops") if k not in manifest]
    if missing:
        return f"manifest lacks {', '.join(missing)}"
    if not isinstance(manifest["name"], str):
        return f"manifest name is a {type(manifest['name']).__name__}, expected a str"
    if not _is_op_table(manifest["ops"]):
        return "manifest ops must map op names to 'module:function' strings"
    required = manifest.get("requires_sgljit")
    if required:
        try:
            compatible = _satisfies(__version__, required)
        except Exception:  # packaging's InvalidSpecifier
            return f"manifest requires_sgljit {required!r} is not a version specifier"
        if not compatible:
            return f"incompatible: needs sgljit{required}, this is sgljit {__version__}"
    return None


@functools.lru_cache(maxsize=1)
def discover() -> tuple[Plugin, ...]:
    """Every installed plugin (disabled ones left out), with its manifest or the reason it is unusable."""
    disabled = _disabled()
    plugins = []
    for name, value, dist in _entry_points():
        if name in disabled:
            continue
        plugin = Plugin(entry_point=name, distribution=dist)
        try:
            plugin.manifest = load_target(value)
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
        raise AttributeError(_missing_op_message(op))
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
    try:
        return load_target(target)
    except Exception as err:
        raise PluginError(
            f"op {op!r}: plugin {plugin.distribution} failed to load {target}: {type(err).__name__}: {err}"
        ) from err


def _missing_op_message(op: str) -> str:
    installed = ", ".join(sorted(op_table())) or "none (no plugins installed)"
    distribution = KNOWN_OPS.get(op)
    if distribution is None:
        return f"sgljit.ops has no op {op!r}; installed ops: {installed}"
    disabled = os.environ.get("SGLJIT_DISABLE_PLUGINS", "").strip()
    unless = f", or SGLJIT_DISABLE_PLUGINS={disabled!r} disables it" if disabled else ""
    return (
        f"sgljit.ops has no op {op!r}: {distribution} provides it and is not installed "
        f"({install_hint([distribution])}){unless}; installed ops: {installed}"
    )


def reset() -> None:
    """Forget discovery results (after installing or removing plugins in a running process)."""
    discover.cache_clear()
    resolve_op.cache_clear()
