"""sgljit.integrations.apply_to_diffusers: diffusers' get_timestep_embedding (and the Timesteps
modules that call it) on the timestep_embedding kernel, against diffusers' own code.

Tolerance: diffusers' float32 ``exp`` may be an ulp off the kernel's correctly rounded frequency,
which moves the sin/cos argument by up to ``|t * scale| * 1.2e-7``; the kernel's sin/cos are within
1e-6. Every argument of the function is exercised; what the kernel cannot take exactly runs
diffusers' code (results equal bit for bit, no kernel call).
"""

from __future__ import annotations

import importlib
import sys
import types

import numpy as np
import pytest
import torch

import sgljit.integrations as sgl

from ..plugins.common import BACKENDS
from .conftest import called

diffusers = pytest.importorskip(
    "diffusers", reason="diffusers is not installed (the nox sessions install it)"
)
from diffusers.models import embeddings  # noqa: E402

ORIGINAL = embeddings.get_timestep_embedding


def tolerance(t: torch.Tensor, scale: float) -> float:
    return 2e-6 + 2.5e-7 * float(t.double().abs().max()) * abs(scale)


def timesteps(device: str, dtype=torch.float32, n: int = 33) -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    t = torch.rand(n, generator=g, dtype=torch.float64) * 1000
    t[0], t[1] = 0.0, 999.0
    return t.to(dtype).to(device)


# (embedding_dim, flip_sin_to_cos, downscale_freq_shift, scale, max_period)
ARGUMENTS = [
    (256, True, 0, 1, 10000),  # SD3 / Flux / Wan's Timesteps
    (320, False, 1, 1, 10000),  # the function's defaults (SD 1.x UNets: flip True, shift 0)
    (257, False, 1, 1, 10000),  # odd: a zero column
    (128, True, 0.5, 1000.0, 10000),  # scale (timesteps in [0, 1])
    (64, False, 0, 1, 100),  # max_period
    (1, True, 0, 1, 10000),  # only the zero column
]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(
    "args", ARGUMENTS, ids=lambda a: "dim{}-flip{}-shift{}-scale{}-max{}".format(*a)
)
def test_get_timestep_embedding(backend, backend_env, op_calls, args):
    device, ctx = backend_env
    dim, flip, shift, scale, max_period = args
    t = timesteps(device)
    if scale != 1:
        t = t / 1000
    expected = ORIGINAL(t, dim, flip, shift, scale, max_period)
    with ctx():
        sgl.apply_to_diffusers()
        got = embeddings.get_timestep_embedding(
            t,
            dim,
            flip_sin_to_cos=flip,
            downscale_freq_shift=shift,
            scale=scale,
            max_period=max_period,
        )
    assert called(op_calls, "timestep_embedding") == 1
    assert got.dtype == expected.dtype == torch.float32 and got.shape == expected.shape
    torch.testing.assert_close(got, expected, rtol=0, atol=tolerance(t, scale))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [torch.int64, torch.float16, torch.float64])
def test_timestep_dtypes(backend, backend_env, op_calls, dtype):
    """diffusers converts timesteps with .float(): so does the kernel route."""
    device, ctx = backend_env
    t = timesteps(device, dtype)
    expected = ORIGINAL(t, 256)
    with ctx():
        sgl.apply_to_diffusers()
        got = embeddings.get_timestep_embedding(t, 256)
    assert called(op_calls, "timestep_embedding") == 1
    torch.testing.assert_close(got, expected, rtol=0, atol=tolerance(t, 1))


@pytest.mark.parametrize("backend", BACKENDS)
def test_unet_and_timesteps_module(backend, backend_env, op_calls):
    """A tiny UNet2DModel (its Timesteps: flip_sin_to_cos=True, shift 0) patched against unpatched."""
    device, ctx = backend_env
    torch.manual_seed(0)
    unet = diffusers.UNet2DModel(
        sample_size=8,
        in_channels=3,
        out_channels=3,
        block_out_channels=(32, 64),
        layers_per_block=1,
        norm_num_groups=8,
        down_block_types=("DownBlock2D", "DownBlock2D"),
        up_block_types=("UpBlock2D", "UpBlock2D"),
    ).to(device)
    assert isinstance(unet.time_proj, embeddings.Timesteps)
    sample = torch.randn(2, 3, 8, 8).to(device)
    t = torch.tensor([10.0, 999.0], device=device)
    with torch.no_grad():
        expected = unet(sample, t).sample
        with ctx():
            sgl.apply_to_diffusers()
            got = unet(sample, t).sample
    assert called(op_calls, "timestep_embedding") == 1
    # The kernel's sin/cos of t * freq (t up to 999) differ from diffusers' by ~1e-4; the UNet
    # carries that to a few 1e-4 (seen on the H200).
    torch.testing.assert_close(got, expected, rtol=2e-3, atol=2e-3)


def test_falls_back_to_diffusers(op_calls):
    """What the kernel does not take exactly runs diffusers' function: same result, no kernel."""
    sgl.apply_to_diffusers()
    t = timesteps("cpu")
    cases = [
        ((t.clone().requires_grad_(), 16), {}),  # autograd
        ((t, 16), {"downscale_freq_shift": 8}),  # dim // 2 == shift: diffusers divides by zero
        ((t, np.int64(16)), {}),  # not an int
        ((t, 16), {"scale": torch.tensor(2.0)}),  # a tensor scalar
        ((t, 16), {"scale": float("inf")}),
    ]
    for args, kwargs in cases:
        expected = ORIGINAL(*args, **kwargs)
        got = embeddings.get_timestep_embedding(*args, **kwargs)
        torch.testing.assert_close(got, expected, rtol=0, atol=0, equal_nan=True)
    with pytest.raises(AssertionError):  # diffusers' own check of a 2-D tensor
        embeddings.get_timestep_embedding(t[:, None], 16)
    assert not op_calls


def test_patches_modules_that_bound_the_function():
    """A diffusers module that did ``from ..embeddings import get_timestep_embedding`` before the
    patch gets the patched function too; revert restores both."""
    uvit = importlib.import_module("diffusers.models.unets.uvit_2d")
    assert uvit.get_timestep_embedding is ORIGINAL
    sgl.apply_to_diffusers()
    patched = embeddings.get_timestep_embedding
    assert patched is not ORIGINAL and uvit.get_timestep_embedding is patched
    assert patched.__wrapped__ is ORIGINAL
    sgl.apply_to_diffusers()  # idempotent
    assert embeddings.get_timestep_embedding.__wrapped__ is ORIGINAL
    sgl.revert()
    assert embeddings.get_timestep_embedding is ORIGINAL and uvit.get_timestep_embedding is ORIGINAL


def test_revert_reaches_modules_imported_while_patched(monkeypatch):
    """diffusers imports lazily: a module first imported after the patch binds the wrapper by name
    (as ``from ..embeddings import get_timestep_embedding`` does); revert gives it diffusers'
    function back, and a second apply moves it to the new wrapper."""
    late, later = types.ModuleType("late"), types.ModuleType("later")
    monkeypatch.setitem(sys.modules, "diffusers._sgljit_test_late", late)
    monkeypatch.setitem(sys.modules, "diffusers._sgljit_test_later", later)
    sgl.apply_to_diffusers()
    late.get_timestep_embedding = embeddings.get_timestep_embedding  # imported while patched
    sgl.apply_to_diffusers()
    assert late.get_timestep_embedding is embeddings.get_timestep_embedding
    later.get_timestep_embedding = embeddings.get_timestep_embedding
    sgl.revert()
    assert embeddings.get_timestep_embedding is ORIGINAL
    assert late.get_timestep_embedding is ORIGINAL and later.get_timestep_embedding is ORIGINAL


def test_refuses_another_signature(monkeypatch):
    def other(timesteps, embedding_dim, flip_sin_to_cos=False, downscale_freq_shift=0, scale=1):
        raise AssertionError("not called")

    monkeypatch.setattr(embeddings, "get_timestep_embedding", other)
    with pytest.raises(RuntimeError, match="is not the function sgljit's timestep_embedding"):
        sgl.apply_to_diffusers()
    assert embeddings.get_timestep_embedding is other


def test_missing_diffusers(monkeypatch):
    monkeypatch.setitem(sys.modules, "diffusers.models", None)
    with pytest.raises(ImportError, match=r"needs diffusers \(pip install diffusers\)"):
        sgl.apply_to_diffusers()
