"""Every installed kernel family lists what `sgljit build` prebuilds, for each backend."""

from __future__ import annotations

import importlib

import pytest
import torch

from sgljit.fleet import prebuild_jobs

FAMILIES = {"activation", "norm", "rope", "quant_fp8", "timestep_embedding"}


@pytest.mark.parametrize("backend", ["cuda", "sycl"])
def test_every_family_declares_prebuilds(backend):
    jobs, problems = prebuild_jobs(sorted(FAMILIES), backend)
    assert problems == []
    assert {job["plugin"] for job in jobs} == FAMILIES
    assert all(job["builder"].endswith(".prebuild") and job["label"] for job in jobs)


@pytest.mark.parametrize("backend", ["cuda", "sycl"])
def test_build_cases_adds_every_check_case_module(backend):
    """`sgljit build --cases`: the declared prebuilds plus, once each, the module every op's check
    case needs (the key the op computes from the case's arguments)."""
    declared, _ = prebuild_jobs(sorted(FAMILIES), backend)
    jobs, problems = prebuild_jobs(sorted(FAMILIES), backend, cases=True)
    assert problems == []
    assert all(job in jobs for job in declared)
    specs = [job["spec"] for job in jobs]
    assert len(specs) > len(declared)
    assert len({repr(sorted(s.items())) for s in specs}) == len(specs)  # each module once
    checked = 0
    for name in sorted(FAMILIES):
        family = importlib.import_module(f"sgljit_{name}.ops").family
        own = [job["spec"] for job in jobs if job["plugin"] == name]
        for op in family.ops.values():
            kernel = getattr(op, backend)
            if kernel is None:
                continue
            for case in op.cases:
                key = kernel.key(*case.make(torch.device("cpu")))
                params = kernel.params_of(key) if backend == "cuda" else dict(key)
                want = {"op": op.name, **{k: _plain(v) for k, v in params.items()}}
                module = kernel.module or op.name
                found = [s for s in own if _module(family, s, backend) == module]
                assert any(_same_key(s, want) for s in found), (op.name, case.name)
                checked += 1
    assert checked > 50


def _plain(value):
    return str(value).removeprefix("torch.") if isinstance(value, torch.dtype) else value


def _module(family, spec, backend):
    return getattr(family.ops[spec["op"]], backend).module or spec["op"]


def _same_key(a, b):
    return {k: v for k, v in a.items() if k != "op"} == {k: v for k, v in b.items() if k != "op"}
