"""``sgljit new-plugin NAME``: write a new plugin package to start from.

The package is a copy of ``templates/plugin/`` (package data) with the names filled in
(``string.Template``: ``$name``, ``$family``, ``$dist``, ``$package``, ``$requires_sgljit``);
``__package__`` and ``__family__`` in file names become the package and family names and ``.tmpl``
is dropped. It holds one small elementwise op, ``scaled_silu``, complete: its spec, reference, CUDA
and SYCL kernels, check cases and prebuild keys, with a README and a conformance test that passes
as written once the package is installed.
"""

from __future__ import annotations

import argparse
import re
import string
import sys
from pathlib import Path

from ._version import __version__

__all__ = ["TEMPLATES", "add_parser", "compatible_range", "new_plugin", "plugin_names"]

TEMPLATES = Path(__file__).parent / "templates" / "plugin"
_NAME = re.compile(r"[a-z][a-z0-9]*(?:[-_][a-z0-9]+)*")


def compatible_range(version: str) -> str:
    """The sgljit versions a new plugin accepts: this minor series before 1.0, then this major."""
    major, minor = (int(p) for p in version.split(".")[:2])
    upper = f"{major}.{minor + 1}" if major == 0 else f"{major + 1}"
    return f">={major}.{minor},<{upper}"


def plugin_names(name: str) -> dict[str, str]:
    """The names NAME gives a plugin: ``my-act`` → family ``my_act``, distribution
    ``sgljit-my-act``, package ``sgljit_my_act``."""
    if not _NAME.fullmatch(name) or name == "sgljit" or name.startswith(("sgljit-", "sgljit_")):
        raise ValueError(
            f"plugin name {name!r} is not valid: expected lowercase letters and digits, starting "
            "with a letter, words joined by single '-' or '_' (e.g. my-act), without 'sgljit-' "
            "(the distribution's name gets it)"
        )
    family = name.replace("-", "_")
    return {
        "name": name,
        "family": family,
        "dist": "sgljit-" + family.replace("_", "-"),
        "package": "sgljit_" + family,
        "requires_sgljit": compatible_range(__version__),
    }


def name_taken(names: dict[str, str]) -> str | None:
    """Why a new plugin may not take these names, or None: an installed plugin has its family,
    distribution or package, or one of sgljit's own families has it (installing the new package
    would replace or shadow that one)."""
    import importlib.util
    from importlib.metadata import PackageNotFoundError, distribution

    from .plugins import discover, known_distributions

    for plugin in discover():
        if plugin.name == names["family"] or plugin.entry_point == names["family"]:
            return f"the installed plugin {plugin.distribution} is family {names['family']!r}"
    if names["dist"] in known_distributions():
        return f"{names['dist']} is one of sgljit's own plugins"
    try:
        distribution(names["dist"])
        return f"a distribution named {names['dist']} is installed"
    except PackageNotFoundError:
        pass
    if importlib.util.find_spec(names["package"]) is not None:
        return f"a package named {names['package']} is importable"
    return None


def new_plugin(name: str, dest: str | Path | None = None) -> Path:
    """Write the plugin package for ``name`` into the new folder ``dest`` (default: the family
    name in the current folder); returns the folder. Refuses an existing ``dest``, and a name
    another plugin has (:func:`name_taken`)."""
    names = plugin_names(name)
    taken = name_taken(names)
    if taken:
        raise ValueError(
            f"plugin name {name!r} is taken: {taken}; its pip install would replace or shadow "
            "that one. Choose another name (e.g. my-" + names["name"] + ")"
        )
    files = {}
    for template in sorted(TEMPLATES.rglob("*")):
        if template.is_file():
            rel = template.relative_to(TEMPLATES).as_posix()
            rel = rel.replace("__package__", names["package"]).replace(
                "__family__", names["family"]
            )
            text = template.read_text()
            if rel.endswith(".tmpl"):
                rel, text = rel.removesuffix(".tmpl"), string.Template(text).substitute(names)
            files[rel] = text
    root = Path(dest if dest is not None else names["family"])
    try:
        root.mkdir(parents=True)
    except FileExistsError:
        raise FileExistsError(
            f"{root} already exists: new-plugin writes a new folder and overwrites nothing "
            "(give another --dir)"
        ) from None
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


def cmd_new_plugin(args: argparse.Namespace) -> int:
    try:
        root = new_plugin(args.name, args.dest)
    except (ValueError, OSError) as err:
        print(f"sgljit new-plugin: error: {err}", file=sys.stderr)
        return 2
    names = plugin_names(args.name)
    print(
        f"wrote {names['dist']} (package {names['package']}, family {names['family']}, "
        f"op scaled_silu) into {root}:"
    )
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        print(f"  {path.relative_to(root).as_posix()}")
    # `python -m`: the pip and pytest of the Python that has sgljit, not others on PATH (a system
    # pytest would not see the plugin).
    folder = (
        root.as_posix()
        if root.is_absolute() or root.as_posix().startswith(".")
        else f"./{root.as_posix()}"
    )
    print(
        f"\nnext (with the Python that has sgljit):\n"
        f'  python -m pip install -e "{folder}[test]"     # the plugin, and pytest to test it\n'
        f"  python -m pytest {folder}/tests\n"
        f"  sgljit check --plugin {names['family']}"
    )
    return 0


def add_parser(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "new-plugin",
        help="write a new plugin package (a working elementwise op to start from)",
        description="Write a new plugin package: pyproject.toml with the sgljit.plugins entry "
        "point, the op spec, a CUDA and a SYCL kernel for scaled_silu (out = silu(input) * "
        "scale), the reference, a README and a conformance test.",
    )
    parser.add_argument(
        "name",
        metavar="NAME",
        help="the family's name, e.g. my-act: distribution sgljit-my-act, package sgljit_my_act, "
        "family my_act",
    )
    parser.add_argument(
        "--dir",
        dest="dest",
        metavar="DEST",
        help="the folder to create (default: ./<family>, e.g. ./my_act); it must not exist",
    )
    parser.set_defaults(fn=cmd_new_plugin)
