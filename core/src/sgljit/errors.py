"""Exceptions raised by sgljit."""

from __future__ import annotations


class SgljitError(RuntimeError):
    """Base class of sgljit's own errors."""


class CompileError(SgljitError):
    """A kernel failed to build. Nothing was cached.

    Attributes:
        command: the compiler command line that failed (a string, ready to paste into a shell).
        source_path: the generated source, kept for inspection outside the cache.
        output: everything the compiler printed.
    """

    def __init__(self, message: str, *, command: str = "", source_path: str = "", output: str = ""):
        self.message = message
        self.command = command
        self.source_path = source_path
        self.output = output
        parts = [message]
        if command:
            parts.append(f"command: {command}")
        if source_path:
            parts.append(f"source: {source_path}")
        if output:
            parts.append(f"compiler output:\n{output.rstrip()}")
        super().__init__("\n".join(parts))


class CacheError(SgljitError):
    """The module cache folder could not be read or written; the message names the folder, what
    was tried and the setting that fixes it (``SGLJIT_CACHE_DIR``, permissions, disk space)."""


class NoCompileError(SgljitError):
    """A module was missing from the cache while SGLJIT_NO_COMPILE=1 forbids compiling."""


class PluginError(SgljitError):
    """A plugin could not provide the op asked for (broken, incompatible or conflicting)."""
