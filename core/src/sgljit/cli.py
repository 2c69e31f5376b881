"""The ``sgljit`` command: ``info``, ``cache path|list|clear``, ``clangd``, ``check``, ``build``,
``new-plugin``."""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tarfile
from pathlib import Path

from ._version import __version__
from .errors import SgljitError


def _folder_size(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) if path.exists() else 0


def _human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def _version_of(dist: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(dist)
    except PackageNotFoundError:
        return "not installed"


def cmd_info(args: argparse.Namespace) -> int:
    from . import toolchain
    from .cache import cache_root
    from .plugins import discover, install_hint, known_distributions, op_table

    rows = [
        ("sgljit", __version__),
        ("python", sys.version.split()[0]),
        ("torch", _version_of("torch")),
        ("apache-tvm-ffi", _version_of("apache-tvm-ffi")),
    ]
    cxx = shutil.which(toolchain.host_cxx())
    rows.append(
        (
            "c++",
            f"{cxx}: {toolchain.compiler_identity(cxx).splitlines()[0]}" if cxx else "not found",
        )
    )
    nvcc = toolchain.find_nvcc()
    if nvcc:
        ident = toolchain.compiler_identity(nvcc).splitlines()
        rows.append(("nvcc", f"{nvcc}: {ident[-1] if ident else '?'}"))
        try:
            rows.append(("CUDA_HOME", toolchain.cuda_home()))
        except Exception as err:
            rows.append(("CUDA_HOME", f"unknown ({err})"))
    else:
        rows.append(("nvcc", "not found (CUDA kernels cannot be built)"))
    import torch

    if torch.cuda.is_available():
        for i in range(torch.cuda.device_count()):
            cap = torch.cuda.get_device_capability(i)
            rows.append((f"cuda:{i}", f"{torch.cuda.get_device_name(i)} (sm {cap[0]}.{cap[1]})"))
    else:
        rows.append(("cuda", "no GPU visible"))
    try:
        rows.append(("cuda arch", " ".join(toolchain.cuda_arch_list())))
    except Exception as err:
        rows.append(("cuda arch", f"none ({err})"))
    rows.append(("cuda launches", _pdl_state()))
    rows += _sycl_rows()
    root = cache_root()
    rows.append(("cache", f"{root} ({_human(_folder_size(root))})"))
    width = max(len(k) for k, _ in rows)
    for key, value in rows:
        print(f"{key:<{width}}  {value}")
    print("\nplugins:")
    plugins = discover()
    if not plugins:
        print(f"  none installed ({install_hint(known_distributions())})")
    table = op_table()
    for plugin in plugins:
        print(f"  {plugin.name:<22} {plugin.distribution:<34} {plugin.status}")
        for op in sorted(plugin.ops):
            conflict = len(table.get(op, ())) > 1
            print(f"    {op}{'  (CONFLICT: claimed by several plugins)' if conflict else ''}")
    return 0


def _pdl_state() -> str:
    """How CUDA kernels are launched (mirrors sgljit::pdl_enabled in include/sgljit/cuda.cuh)."""
    if os.environ.get("SGLJIT_PDL") == "0":
        return "ordinary (SGLJIT_PDL=0)"
    return "programmatic dependent launch on sm_90+ (SGLJIT_PDL=0 turns it off)"


def _sycl_rows() -> list[tuple[str, str]]:
    try:
        from . import sycl
    except ImportError:
        return [("sycl", "backend not available")]
    try:
        info = sycl.describe()
    except Exception as err:
        return [("sycl", f"unavailable ({err})")]
    return [(f"sycl {k}", str(v)) for k, v in info.items()]


def cmd_cache(args: argparse.Namespace) -> int:
    from .publish import clear_stale
    from .store import cache_root, published_entries, read_entry

    root = cache_root()
    if args.action == "path":
        print(root)
    elif args.action == "list":
        entries = published_entries(root)
        if not entries:
            print(f"(empty) {root}")
        for entry in entries:
            try:
                data, problem = read_entry(entry)  # the validity rule's manifest half
            except OSError as err:
                data, problem = {}, f"unreadable manifest ({err})"
            if problem:  # a load would not use it either: it rebuilds over such an entry
                print(f"BROKEN {entry.relative_to(root)}: {problem}")
                continue
            print(
                f"{data['backend']:<6} {data['arch']:<10} {data['name']:<48} "
                f"{data['key']}/{entry.name}  {_human(_folder_size(entry)):>9}  "
                f"built {data.get('built_at', '?')}"
            )
    elif args.action == "clear" and args.stale:
        print(f"removed {clear_stale(root)} stale entries from {root}")
    elif args.action == "clear":
        if root.exists():
            shutil.rmtree(root)
        print(f"cleared {root}")
    elif args.action in ("export", "import"):
        from . import fleet

        return (
            fleet.cache_export(args.file)
            if args.action == "export"
            else fleet.cache_import(args.file)
        )
    return 0


def cmd_clangd(args: argparse.Namespace) -> int:
    """Write a .clangd so editors resolve sgljit's, tvm-ffi's and CUDA's headers in kernel sources."""
    import tvm_ffi.libinfo

    from . import toolchain
    from .cuda import include_dir

    flags = ["-xcuda", "-std=c++17", f"-I{include_dir()}"]
    flags += [f"-I{p}" for p in dict.fromkeys(tvm_ffi.libinfo.include_paths())]
    try:
        home = toolchain.cuda_home()
        flags += [f"--cuda-path={home}", f"-I{Path(home, 'include')}"]
    except Exception:
        pass
    flags += ["--cuda-gpu-arch=sm_90a", "-Wno-unknown-cuda-version"]
    text = "CompileFlags:\n  Add:\n" + "".join(f"    - {f}\n" for f in flags)
    text += "  Remove:\n    - -forward-unknown-to-host-compiler\n    - --generate-code*\n"
    target = Path(args.output)
    target.write_text(text)
    print(f"wrote {target}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="sgljit", description="JIT-compiled GPU kernels for serving"
    )
    parser.add_argument("--version", action="version", version=f"sgljit {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("info", help="versions, compilers, devices, plugins, cache").set_defaults(
        fn=cmd_info
    )
    cache = sub.add_parser("cache", help="inspect or clear the module cache")
    cache.add_argument("action", choices=["path", "list", "clear", "export", "import"])
    cache.add_argument("file", nargs="?", help="archive for export/import")
    cache.add_argument(
        "--stale",
        action="store_true",
        help="with clear: remove only what no process can use (dead builds' staging folders, "
        "the trash, failed builds, an older cache layout)",
    )
    cache.set_defaults(fn=cmd_cache)
    clangd = sub.add_parser("clangd", help="write a .clangd for editing kernels")
    clangd.add_argument("--output", default=".clangd")
    clangd.set_defaults(fn=cmd_clangd)
    from . import scaffold

    scaffold.add_parser(sub)
    try:
        from . import check

        check.add_parser(sub)
    except ImportError:
        pass
    try:
        from . import fleet

        fleet.add_build_parser(sub)
    except ImportError:
        pass
    args = parser.parse_args(argv)
    if args.command == "cache" and args.action in ("export", "import") and not args.file:
        parser.error(f"cache {args.action} needs a FILE")
    try:
        return args.fn(args)
    except KeyboardInterrupt:
        print(f"sgljit {args.command}: interrupted", file=sys.stderr)
        return 130
    except (OSError, ValueError, tarfile.TarError, SgljitError) as err:
        # a missing or unwritable file, a bad archive, a cache error: the message, not a traceback
        print(f"sgljit {args.command}: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
