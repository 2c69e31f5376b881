"""Every installed kernel family lists what `sgljit build` prebuilds, for each backend."""

from __future__ import annotations

import pytest

from sgljit.fleet import prebuild_jobs

FAMILIES = {"norm", "rope", "quant_fp8", "timestep_embedding"}


@pytest.mark.parametrize("backend", ["cuda", "sycl"])
def test_every_family_declares_prebuilds(backend):
    jobs, problems = prebuild_jobs(sorted(FAMILIES), backend)
    assert problems == []
    assert {job["plugin"] for job in jobs} == FAMILIES
    assert all(job["builder"].endswith(".prebuild") and job["label"] for job in jobs)
