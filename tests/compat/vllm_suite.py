"""The harness that runs vLLM's own kernel tests, vendored unmodified in ``tests/compat/vllm/``
(see its SOURCE.md), against :mod:`sgljit.compat.vllm` (used by ``test_vllm_suite.py``).

:func:`run_file` runs one file with pytest in a fresh interpreter with this module as a plugin
(``-p vllm_suite``) and reads each case's outcome from its JUnit report (``sglang_suite``'s
``Outcome``, ``assert_passes``). As that plugin, before the file is collected, it makes what the
file imports resolve:

| the file imports | resolves to |
|---|---|
| ``torch.ops._C.<op>`` (vLLM's compiled ops) | torch custom ops ``_C::<op>`` on the functions of ``sgljit.compat.vllm._custom_ops`` |
| ``vllm.model_executor.layers.layernorm`` ``RMSNorm``, ``GemmaRMSNorm`` | layers whose ``forward_native`` is vLLM's PyTorch (``vllm/ir/ops/layernorm.py``) and whose ``forward`` calls the compat ops, as vLLM's ``forward_cuda`` |
| ``vllm.model_executor.layers.rotary_embedding`` ``RotaryEmbedding``, ``get_rope`` | vLLM's cos/sin cache, ``forward_native`` (``rotary_embedding/base.py``, ``common.py``) and ``forward_cuda`` on the compat ``rotary_embedding``; ``get_rope``'s module cache; rope types default, linear, dynamic |
| ``vllm.ir``, ``vllm.platforms``, ``vllm.utils.torch_utils`` | the tolerances, ``current_platform`` (CUDA, fp8 e4m3fn), ``set_random_seed`` |
| ``tests.kernels.utils``, ``.quant_utils``, ``.allclose_default`` | vLLM's ``opcheck`` (``torch.library.opcheck``, every test util), ``FP8_DTYPE``, default tolerances |
| fixtures ``default_vllm_config``, ``dist_init`` | nothing to set up (no vLLM config, one process) |

Written from vLLM 0.33.0's code (the release the files come from). Without a GPU
(``SGLJIT_COMPAT_DEVICE=cpu``) sglang_suite's torch function mode gives every torch call asking for a
CUDA device the CPU (one device), and ``SGLJIT_BACKEND`` picks the backend (``sycl``: the SYCL CPU
device).
"""

from __future__ import annotations

import importlib
import os
import random
import shlex
import shutil
import subprocess
import sys
import unittest.mock
import zlib
from pathlib import Path

VENDORED = Path(__file__).resolve().parent / "vllm"


def run_file(name: str, backend: str, workdir: Path, *, sample: int = 1, deselect=(),
             timeout: float = 3600):  # fmt: skip
    """pytest over a copy of the vendored ``name`` in ``workdir`` with this plugin; ``backend``
    "cuda" runs it on the GPU, "reference" and "sycl" on the CPU. ``sample`` > 1: about one case
    in ``sample`` (:func:`sample`). ``SGLJIT_COMPAT_PYTEST_ARGS`` adds pytest arguments."""
    sglang_suite = _shared()
    local = Path(shutil.copyfile(VENDORED / name, workdir / name))
    ini = workdir / "pytest.ini"
    ini.write_text("[pytest]\nfilterwarnings = ignore::DeprecationWarning\n")
    report = workdir / "report.xml"
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    env.pop("SGLJIT_BACKEND", None)
    env.update(
        PYTHONPATH=os.pathsep.join(
            filter(None, [str(Path(__file__).parent), env.get("PYTHONPATH")])
        ),
        SGLJIT_COMPAT_DEVICE="cuda" if backend == "cuda" else "cpu",
        SGLJIT_COMPAT_SAMPLE=str(sample),
        **({} if backend == "cuda" else {"SGLJIT_BACKEND": backend}),
    )
    cmd = [
        sys.executable, "-m", "pytest", "-q", "-p", "vllm_suite", "-p", "no:cacheprovider",
        "-p", "no:randomly", "-c", str(ini), "--rootdir", str(workdir), "--junitxml", str(report),
        *shlex.split(os.environ.get("SGLJIT_COMPAT_PYTEST_ARGS", "")),
        *(f"--deselect={d}" for d in deselect if d.startswith(f"{name}::")), local.name,
    ]  # fmt: skip
    done = subprocess.run(
        cmd, cwd=workdir, env=env, capture_output=True, text=True, timeout=timeout
    )
    return sglang_suite.Outcome(
        f"{name} on {backend}", done.returncode, sglang_suite._cases(report, name),
        done.stdout + done.stderr,
    )  # fmt: skip


def _shared():
    """sglang_suite: beside this module in the package (the test session) or on the path (the
    plugin's interpreter)."""
    if __package__:
        return importlib.import_module(f"{__package__}.sglang_suite")
    return importlib.import_module("sglang_suite")


# ------------------------------------------------------------------------------------------------
# The plugin side


def _register_c_ops():
    """``torch.ops._C.<op>``: vLLM's schemas (csrc/torch_bindings.cpp) on the compat functions."""
    import torch

    from sgljit.compat.vllm import _custom_ops as ops

    schemas = {
        "rms_norm": "(Tensor(a!) result, Tensor input, Tensor? weight, float epsilon) -> ()",
        "fused_add_rms_norm": (
            "(Tensor(a!) input, Tensor(b!) residual, Tensor? weight, float epsilon) -> ()"
        ),
        "rms_norm_static_fp8_quant": (
            "(Tensor(a!) result, Tensor input, Tensor weight, Tensor scale, float epsilon) -> ()"
        ),
        "fused_add_rms_norm_static_fp8_quant": (
            "(Tensor(a!) result, Tensor input, Tensor(b!) residual, Tensor weight, Tensor scale, "
            "float epsilon) -> ()"
        ),
        "static_scaled_fp8_quant": (
            "(Tensor(a!) result, Tensor input, Tensor scale, int[]? group_shape=None) -> ()"
        ),
        "dynamic_scaled_fp8_quant": "(Tensor(a!) result, Tensor input, Tensor(b!) scale) -> ()",
        "dynamic_per_token_scaled_fp8_quant": (
            "(Tensor(a!) result, Tensor input, Tensor(b!) scale, Tensor? scale_ub) -> ()"
        ),
        "rotary_embedding": (
            "(Tensor positions, Tensor(a!) query, Tensor(b!)? key, int head_size, "
            "Tensor cos_sin_cache, bool is_neox, int rope_dim_offset=0, bool inverse=False) -> ()"
        ),
    }
    for name, schema in schemas.items():
        mutated = [arg.split()[-1] for arg in schema[1:].split(") ->")[0].split(", ") if "!" in arg]
        op = torch.library.custom_op(
            f"_C::{name}", getattr(ops, name), mutates_args=mutated, schema=schema
        )
        op.register_fake(lambda *args, **kwargs: None)


def _layernorm_module():
    import torch
    from torch import nn

    from sgljit import ops as sgl
    from sgljit.compat.vllm import _custom_ops as ops

    def native_rms_norm(x, weight, epsilon):  # vllm/ir/ops/layernorm.py rms_norm
        orig_dtype = x.dtype
        x = x.to(torch.float32)
        x = x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + epsilon)
        if weight is not None:
            x = x.to(weight.dtype) * weight
        return x.to(orig_dtype)

    def native_fused_add(x, residual, weight, epsilon):  # ... fused_add_rms_norm
        orig_dtype = x.dtype
        x = x.to(torch.float32) + residual.to(torch.float32)
        residual = x.to(orig_dtype)
        x = x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + epsilon)
        if weight is not None:
            x = x.to(weight.dtype) * weight
        return x.to(orig_dtype), residual

    class RMSNorm(nn.Module):
        def __init__(self, hidden_size, eps=1e-6, var_hidden_size=None, has_weight=True,
                     dtype=None):  # fmt: skip
            super().__init__()
            self.variance_epsilon = eps
            self.has_weight = has_weight
            weight = torch.ones(hidden_size, dtype=dtype or torch.get_default_dtype())
            self.weight = nn.Parameter(weight) if has_weight else weight

        def _weight(self):
            return self.weight.data if self.has_weight else None

        def forward_native(self, x, residual=None):
            if residual is None:
                return native_rms_norm(x, self._weight(), self.variance_epsilon)
            return native_fused_add(x, residual, self._weight(), self.variance_epsilon)

        def forward(self, x, residual=None):  # vLLM's forward_cuda on its _C kernels
            if residual is not None:
                ops.fused_add_rms_norm(x, residual, self._weight(), self.variance_epsilon)
                return x, residual
            out = torch.empty_like(x)
            ops.rms_norm(out, x, self._weight(), self.variance_epsilon)
            return out

    class GemmaRMSNorm(nn.Module):
        def __init__(self, hidden_size, eps=1e-6):
            super().__init__()
            self.weight = nn.Parameter(torch.zeros(hidden_size))
            self.variance_epsilon = eps

        def forward(self, x, residual=None):
            if residual is not None:
                sgl.gemma_fused_add_rmsnorm(x, residual, self.weight.data, self.variance_epsilon)
                return x, residual
            return sgl.gemma_rmsnorm(x, self.weight.data, self.variance_epsilon)

    return {"RMSNorm": RMSNorm, "GemmaRMSNorm": GemmaRMSNorm}


def _rotary_module():
    import torch
    from torch import nn

    from sgljit.compat.vllm import _custom_ops as ops

    def apply_rotary_emb(x, cos, sin, is_neox_style):  # common.py ApplyRotaryEmb.forward_static
        cos = cos.unsqueeze(-2).to(x.dtype)
        sin = sin.unsqueeze(-2).to(x.dtype)
        if is_neox_style:
            x1, x2 = torch.chunk(x, 2, dim=-1)
        else:
            x1, x2 = x[..., ::2], x[..., 1::2]
        o1 = x1 * cos - x2 * sin
        o2 = x2 * cos + x1 * sin
        if is_neox_style:
            return torch.cat((o1, o2), dim=-1)
        return torch.stack((o1, o2), dim=-1).flatten(-2)

    class RotaryEmbedding(nn.Module):  # base.py RotaryEmbeddingBase / RotaryEmbedding
        def __init__(self, head_size, rotary_dim, max_position_embeddings, base, is_neox_style,
                     dtype, init_cache=True):  # fmt: skip
            super().__init__()
            self.head_size, self.rotary_dim = head_size, rotary_dim
            self.max_position_embeddings, self.base = max_position_embeddings, base
            self.is_neox_style, self.dtype = is_neox_style, dtype
            if init_cache:
                cache = self._compute_cos_sin_cache().to(dtype)
                self.register_buffer("cos_sin_cache", cache, persistent=False)

        def _compute_inv_freq(self, base):
            exponents = torch.arange(0, self.rotary_dim, 2, dtype=torch.float) / self.rotary_dim
            return 1.0 / (base**exponents)

        def _compute_cos_sin_cache(self):
            inv_freq = self._compute_inv_freq(self.base)
            t = torch.arange(self.max_position_embeddings, dtype=torch.float)
            freqs = torch.einsum("i,j -> ij", t, inv_freq)
            return torch.cat((freqs.cos(), freqs.sin()), dim=-1)

        def _match_cos_sin_cache_dtype(self, query):
            cache = self.cos_sin_cache
            if cache.device != query.device or cache.dtype != query.dtype:
                self.cos_sin_cache = cache.to(query.device, dtype=query.dtype)
            return self.cos_sin_cache

        def forward_native(self, positions, query, key=None):
            cos_sin_cache = self._match_cos_sin_cache_dtype(query)
            positions = positions.flatten()
            num_tokens = positions.shape[0]
            cos, sin = cos_sin_cache.index_select(0, positions).chunk(2, dim=-1)

            def rotate(x):
                shape = x.shape
                x = x.view(num_tokens, -1, self.head_size)
                x_rot = apply_rotary_emb(x[..., : self.rotary_dim], cos, sin, self.is_neox_style)
                return torch.cat((x_rot, x[..., self.rotary_dim :]), dim=-1).reshape(shape)

            return rotate(query), None if key is None else rotate(key)

        def forward_cuda(self, positions, query, key=None):
            cos_sin_cache = self._match_cos_sin_cache_dtype(query)
            ops.rotary_embedding(positions, query, key, self.head_size, cos_sin_cache,
                                 self.is_neox_style)  # fmt: skip
            return query, key

        forward = forward_cuda

    class LinearScalingRotaryEmbedding(RotaryEmbedding):  # linear_scaling_rope.py, one factor
        def __init__(self, head_size, rotary_dim, max_position, base, is_neox_style, factor,
                     dtype):  # fmt: skip
            self.scaling_factor = factor
            super().__init__(head_size, rotary_dim, max_position, base, is_neox_style, dtype)

        def _compute_cos_sin_cache(self):
            inv_freq = self._compute_inv_freq(self.base)
            max_len = int(self.max_position_embeddings * self.scaling_factor)
            t = torch.arange(max_len, dtype=torch.float) / self.scaling_factor
            freqs = torch.einsum("i,j -> ij", t, inv_freq)
            return torch.cat((freqs.cos(), freqs.sin()), dim=-1)

    class DynamicNTKScalingRotaryEmbedding(RotaryEmbedding):  # dynamic_ntk_scaling_rope.py
        def __init__(self, head_size, rotary_dim, max_position, base, is_neox_style, factor,
                     dtype):  # fmt: skip
            self.scaling_factor = factor
            super().__init__(head_size, rotary_dim, max_position, base, is_neox_style, dtype)

        def _compute_cos_sin_cache(self):
            max_len = self.max_position_embeddings * self.scaling_factor
            base = self.base * (
                (self.scaling_factor * max_len / self.max_position_embeddings)
                - (self.scaling_factor - 1)
            ) ** (self.rotary_dim / (self.rotary_dim - 2))
            inv_freq = self._compute_inv_freq(base)
            t = torch.arange(max_len, dtype=torch.float)
            freqs = torch.einsum("i,j -> ij", t, inv_freq)
            return torch.cat((freqs.cos(), freqs.sin()), dim=-1)

    cache = {}

    def get_rope(head_size, max_position, is_neox_style=True, rope_parameters=None, dtype=None,
                 dual_chunk_attention_config=None, mrope_positions_factor=4):  # fmt: skip
        dtype = dtype or torch.get_default_dtype()
        parameters = dict(rope_parameters or {})
        frozen = tuple((k, tuple(v) if isinstance(v, list) else v) for k, v in parameters.items())
        key = (head_size, max_position, is_neox_style, frozen, dtype)
        if key in cache:
            return cache[key]
        base = parameters.get("rope_theta", 10000)
        rotary_dim = int(head_size * parameters.get("partial_rotary_factor", 1.0))
        kind = parameters.get("rope_type", "default")
        args = (head_size, rotary_dim, max_position, base, is_neox_style)
        if kind == "default":
            rope = RotaryEmbedding(*args, dtype)
        elif kind in ("linear", "dynamic"):
            factor = parameters["factor"]
            factor = factor[0] if isinstance(factor, list | tuple) else factor
            cls = (
                LinearScalingRotaryEmbedding
                if kind == "linear"
                else DynamicNTKScalingRotaryEmbedding
            )
            rope = cls(*args, factor, dtype)
        else:
            raise NotImplementedError(f"rope_type {kind!r} has no stand-in")
        cache[key] = rope
        return rope

    return {"RotaryEmbedding": RotaryEmbedding, "get_rope": get_rope}


def install_shims(on_cpu: bool) -> None:
    import numpy as np
    import torch

    shared = _shared()
    for name in [n for n in sys.modules if n.split(".")[0] in ("vllm", "tests")]:
        del sys.modules[name]
    _register_c_ops()
    module, install = shared._module, shared._install

    def set_random_seed(seed):
        random.seed(seed)
        np.random.seed(seed)
        torch.manual_seed(seed)

    class Platform:
        @staticmethod
        def is_rocm():
            return False

        @staticmethod
        def is_cuda():
            return True

        @staticmethod
        def fp8_dtype():
            return torch.float8_e4m3fn

    tolerances = {  # vllm/ir/tolerances.py, and rms_norm's float16 override
        torch.float32: {"atol": 1e-5, "rtol": 1.3e-6},
        torch.float16: {"atol": 1e-2, "rtol": 2e-3},
        torch.bfloat16: {"atol": 1e-3, "rtol": 1.6e-2},
    }
    rms_norm_op = type("IrOp", (), {"get_tolerance": staticmethod(lambda d: dict(tolerances[d]))})
    install("vllm.ir", module("vllm.ir", ops=module("vllm.ir.ops", rms_norm=rms_norm_op)))
    install("vllm.platforms", module("vllm.platforms", current_platform=Platform()))
    install("vllm.utils.torch_utils", module("vllm.utils.torch_utils",
                                             set_random_seed=set_random_seed))  # fmt: skip
    install("vllm.model_executor.layers.layernorm",
            module("vllm.model_executor.layers.layernorm", **_layernorm_module()))  # fmt: skip
    install("vllm.model_executor.layers.rotary_embedding",
            module("vllm.model_executor.layers.rotary_embedding", **_rotary_module()))  # fmt: skip

    def fp8_allclose(a, b, rtol=1e-05, atol=1e-08, equal_nan=False):
        """tests/kernels/utils.py: torch.allclose in float64 (fp8 tensors too)."""
        torch._refs._check_close_args(name="torch.allclose", a=a, b=b, rtol=rtol, atol=atol)
        close = torch.isclose(a.double(), b.double(), rtol=rtol, atol=atol, equal_nan=equal_nan)
        return bool(torch.all(close).item())

    def opcheck(op, args, kwargs=None, *, test_utils=None, raise_exception=True, cond=True):
        """tests/kernels/utils.py: torch.library.opcheck (every test util) with torch.allclose
        as fp8_allclose."""
        utils = test_utils or ("test_schema", "test_autograd_registration", "test_faketensor",
                               "test_aot_dispatch_dynamic")  # fmt: skip
        if not cond:
            return {}
        with unittest.mock.patch("torch.allclose", new=fp8_allclose):
            return torch.library.opcheck(op, args, kwargs, test_utils=utils,
                                         raise_exception=raise_exception)  # fmt: skip

    def rocm_only(*args, **kwargs):
        raise AssertionError("a ROCm-only helper of vLLM's tests")

    install("tests.kernels.utils", module("tests.kernels.utils", opcheck=opcheck,
            fp8_allclose=fp8_allclose, fp8_ulp_distance=rocm_only))  # fmt: skip
    install("tests.kernels.quant_utils", module("tests.kernels.quant_utils",
                                                FP8_DTYPE=torch.float8_e4m3fn))  # fmt: skip
    atol = {torch.float16: 1e-3, torch.bfloat16: 1e-3, torch.float: 1e-5}
    rtol = {torch.float16: 1e-3, torch.bfloat16: 1.6e-2, torch.float: 1.3e-6}
    install("tests.kernels.allclose_default", module(
        "tests.kernels.allclose_default", get_default_atol=lambda out: atol[out.dtype],
        get_default_rtol=lambda out: rtol[out.dtype]))  # fmt: skip
    if on_cpu:
        shared._run_cuda_on_cpu()
        set_default_device = torch.set_default_device
        torch.set_default_device = lambda device: set_default_device(shared._on_cpu(device))
        torch.accelerator.device_count = lambda: 1  # the CPU stands for one GPU
        torch.accelerator.synchronize = lambda device=None: None


def pytest_configure(config) -> None:
    install_shims(on_cpu=os.environ.get("SGLJIT_COMPAT_DEVICE", "cuda") == "cpu")


def sample(items: list, every: int) -> tuple[list, list]:
    """(kept, dropped): the cases whose node id's CRC-32 is a multiple of ``every``, plus, for
    each value of each parameter that none of those has, the first case (in collection order)
    that has it, so every parameter value runs. Deterministic: the same file gives the same
    selection on every machine."""
    kept = [item for item in items if zlib.crc32(item.nodeid.encode()) % every == 0]
    covered = {pair for item in kept for pair in _params(item)}
    for item in items:
        missing = set(_params(item)) - covered
        if missing and item not in kept:
            kept.append(item)
            covered |= set(_params(item))
    chosen = set(map(id, kept))
    return [i for i in items if id(i) in chosen], [i for i in items if id(i) not in chosen]


def _params(item) -> list[tuple[str, str]]:
    spec = getattr(item, "callspec", None)
    return [(item.originalname, k, repr(v)) for k, v in spec.params.items()] if spec else []


def pytest_collection_modifyitems(config, items) -> None:
    """``SGLJIT_COMPAT_SAMPLE=N`` (N > 1): run :func:`sample`'s selection (about 1 in N)."""
    every = int(os.environ.get("SGLJIT_COMPAT_SAMPLE", "1"))
    if every > 1:
        items[:], dropped = sample(items, every)
        config.hook.pytest_deselected(items=dropped)


def pytest_report_header(config) -> list[str]:
    return [
        f"sgljit compat (vLLM): device {os.environ.get('SGLJIT_COMPAT_DEVICE', 'cuda')}, "
        f"backend {os.environ.get('SGLJIT_BACKEND') or 'by device'}"
    ]


try:
    import pytest

    @pytest.fixture
    def default_vllm_config():
        """vLLM's fixture sets a default VllmConfig; the stand-in layers read none."""

    @pytest.fixture
    def dist_init():
        """vLLM's fixture starts a one-process distributed group; nothing here uses one."""

except ImportError:  # imported outside pytest
    pass
