"""Shared by the integration tests: one module cache for the session, the backend a test runs on,
a spy that counts the sgljit ops a patched model called, and every patch undone after a test."""

from __future__ import annotations

import collections
import contextlib
import os

import pytest

import sgljit
import sgljit.integrations

MLP_OPS = ("silu_and_mul", "gelu_tanh_and_mul")


@pytest.fixture(autouse=True)
def _revert():
    """Every patch an integration test made is undone after it."""
    yield
    sgljit.integrations.revert()


@pytest.fixture(scope="session")
def integrations_cache(tmp_path_factory):
    """One module cache for the whole session: modules compile once and are shared by the tests."""
    path = os.environ.get("SGLJIT_CACHE_DIR") or str(tmp_path_factory.mktemp("integrations-cache"))
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SGLJIT_CACHE_DIR", path)
        yield path


@pytest.fixture
def backend_env(request, integrations_cache):
    """(device, context manager) for the test's ``backend`` parameter: CUDA tensors on a GPU, or
    CPU tensors with the reference or the SYCL kernels (on the SYCL CPU device) forced."""
    backend = request.node.callspec.params["backend"]
    if backend == "cuda":
        return "cuda", contextlib.nullcontext
    return "cpu", lambda: sgljit.use_backend(backend)


@pytest.fixture
def op_calls(monkeypatch):
    """A Counter of (op name, last dimension of its first argument) for every call of the sgljit
    ops the integrations use, made through ``sgljit.ops`` (as the patched code calls them)."""
    calls: collections.Counter = collections.Counter()
    names = ("rmsnorm", "gemma_rmsnorm", "apply_rope", "timestep_embedding", *MLP_OPS)
    for name in names:
        op = getattr(sgljit.ops, name)

        def spy(*args, _op=op, _name=name, **kwargs):
            first = args[0]
            calls[_name, first.shape[-1] if first.dim() else 0] += 1
            return _op(*args, **kwargs)

        monkeypatch.setattr(sgljit.ops, name, spy)
    return calls


def called(calls: collections.Counter, name: str) -> int:
    """How many times op ``name`` was called, whatever the width."""
    return sum(n for (op, _), n in calls.items() if op == name)
