"""What no kernel can check for itself, on every backend and op: a written tensor whose elements
share memory (an expanded view: concurrent writes race and the result is garbage), one strided
view passed as two written arguments, or a written tensor over one the op reads, is refused,
naming the argument; a tensor that requires grad is refused by the kernels (they have no
backward) and accepted by the reference."""

from __future__ import annotations

import pytest
import torch

import sgljit

from .common import BACKENDS

T, H, D = 4, 64, 64


def expanded(shape, dtype=torch.float32, device="cpu") -> torch.Tensor:
    """A tensor of ``shape`` whose rows are one row: stride 0 in the first dimension."""
    return torch.zeros((1, *shape[1:]), dtype=dtype, device=device).expand(*shape)


def qk(device):
    return torch.randn(T, 2, D, device=device), torch.randn(T, 1, D, device=device)


def rope_cache(device):
    return torch.randn(16, D, device=device)


# (op call with one written argument expanded, the argument's name). Each builds fresh inputs.
OVERLAPPING = {
    "rmsnorm out": (
        lambda dev: sgljit.ops.rmsnorm(
            torch.randn(T, H, device=dev),
            torch.randn(H, device=dev),
            out=expanded((T, H), device=dev),
        ),
        "out",
    ),
    "fused_add_rmsnorm residual": (
        lambda dev: sgljit.ops.fused_add_rmsnorm(
            torch.randn(T, H, device=dev), expanded((T, H), device=dev), torch.randn(H, device=dev)
        ),
        "residual",
    ),
    "gemma_fused_add_rmsnorm input": (
        lambda dev: sgljit.ops.gemma_fused_add_rmsnorm(
            expanded((T, H), device=dev), torch.randn(T, H, device=dev), torch.randn(H, device=dev)
        ),
        "input",
    ),
    "qknorm q": (
        lambda dev: sgljit.ops.qknorm(
            expanded((T, 2, D), device=dev),
            torch.randn(T, 1, D, device=dev),
            torch.randn(D, device=dev),
            torch.randn(D, device=dev),
        ),
        "q",
    ),
    "qknorm_across_heads k": (
        lambda dev: sgljit.ops.qknorm_across_heads(
            torch.randn(T, 2 * D, device=dev),
            expanded((T, D), device=dev),
            torch.randn(2 * D, device=dev),
            torch.randn(D, device=dev),
        ),
        "k",
    ),
    "apply_rope q": (
        lambda dev: sgljit.ops.apply_rope(
            expanded((T, 2, D), device=dev),
            qk(dev)[1],
            rope_cache(dev),
            torch.arange(T, device=dev),
        ),
        "q",
    ),
    "per_token_quant_fp8 out": (
        lambda dev: sgljit.ops.per_token_quant_fp8(
            torch.randn(T, H, device=dev),
            out=expanded((T, H), dtype=torch.float8_e4m3fn, device=dev),
        ),
        "out",
    ),
    "per_tensor_quant_fp8 out": (
        lambda dev: sgljit.ops.per_tensor_quant_fp8(
            torch.randn(T, H, device=dev),
            torch.ones(1, device=dev),
            out=expanded((T, H), dtype=torch.float8_e4m3fn, device=dev),
        ),
        "out",
    ),
    "timestep_embedding out": (
        lambda dev: sgljit.ops.timestep_embedding(
            torch.arange(T, dtype=torch.float32, device=dev), H, out=expanded((T, H), device=dev)
        ),
        "out",
    ),
    "silu_and_mul out": (
        lambda dev: sgljit.ops.silu_and_mul(
            torch.randn(T, 2 * H, device=dev), out=expanded((T, H), device=dev)
        ),
        "out",
    ),
    "silu_and_mul_per_token_group_quant_fp8 scales": (
        lambda dev: sgljit.ops.silu_and_mul_per_token_group_quant_fp8(
            torch.randn(T, 4 * H, device=dev), H, scales=expanded((T, 2), device=dev)
        ),
        "scales",
    ),
}


def _heads(device, heads=2) -> torch.Tensor:
    """[T, heads, D] heads of a [T, heads + 1, D] buffer: a strided view."""
    return torch.randn(T, heads + 1, D, device=device)[:, :heads]


def _rope_q_as_k(dev):
    q = _heads(dev)
    sgljit.ops.apply_rope(q, q, rope_cache(dev), torch.arange(T, device=dev))


def _qknorm_q_as_k(dev):
    q = _heads(dev)
    sgljit.ops.qknorm(q, q, torch.randn(D, device=dev), torch.randn(D, device=dev))


def _fused_input_as_residual(dev):
    x = _heads(dev, 1)[:, 0]
    sgljit.ops.fused_add_rmsnorm(x, x, torch.randn(D, device=dev))


def _kv_k_cache_as_v_cache(dev):
    (q, k), c, index = qk(dev), _heads(dev, 1), torch.arange(T, device=dev)
    sgljit.ops.apply_rope_with_kv_cache(q, k, k.clone(), c, c, rope_cache(dev), index, index)


# (op call with one strided view passed as two written arguments, the later one's name): the
# kernels' writes would race on every element.
PASSED_TWICE = {
    "apply_rope q, k": (_rope_q_as_k, "k"),
    "qknorm q, k": (_qknorm_q_as_k, "k"),
    "fused_add_rmsnorm input, residual": (_fused_input_as_residual, "residual"),
    "apply_rope_with_kv_cache k_cache, v_cache": (_kv_k_cache_as_v_cache, "v_cache"),
}
REFUSED_WRITES = {**OVERLAPPING, **PASSED_TWICE}


def _fp8_bytes_of(x: torch.Tensor) -> torch.Tensor:
    """An fp8 tensor of x's shape over x's first bytes (x: float32, contiguous)."""
    return x.view(-1).view(torch.float8_e4m3fn)[: x.numel()].view(x.shape)


def _rmsnorm_out_shifted(dev):
    buf = torch.randn(T + 1, H, device=dev)
    sgljit.ops.rmsnorm(buf[1:], torch.randn(H, device=dev), out=buf[:-1])


def _fused_add_weight_in_residual(dev):
    residual = torch.randn(T, H, device=dev)
    sgljit.ops.fused_add_rmsnorm(torch.randn(T, H, device=dev), residual, residual[1])


def _per_tensor_out_over_input(dev):
    x = torch.randn(T, H, device=dev)
    sgljit.ops.per_tensor_quant_fp8(x, torch.ones(1, device=dev), out=_fp8_bytes_of(x))


def _per_token_out_over_input(dev):
    x = torch.randn(T, H, device=dev)
    sgljit.ops.per_token_quant_fp8(x, out=_fp8_bytes_of(x))


def _group_out_over_input(dev):
    x = torch.randn(T, H, device=dev)
    sgljit.ops.per_token_group_quant_fp8(x, H, out=_fp8_bytes_of(x))


def _act_out_over_input(dev):
    x = torch.randn(T, 2 * H, device=dev)
    sgljit.ops.gelu_and_mul(x, out=x[:, H:])  # out over up


def _act_quant_out_over_input(dev):
    x = torch.randn(T, 2 * H, device=dev)
    sgljit.ops.silu_and_mul_per_token_group_quant_fp8(x, H, out=_fp8_bytes_of(x)[:, :H])


def _timestep_t_in_out(dev):
    buf = torch.rand(T * H, device=dev) * 1000
    sgljit.ops.timestep_embedding(buf[:T], H, out=buf.view(T, H))


def _kv_k_in_k_cache(dev):
    (q, _), cache, index = qk(dev), torch.randn(T, 1, D, device=dev), torch.arange(T, device=dev)
    k = cache[:, :1]
    sgljit.ops.apply_rope_with_kv_cache(
        q, k, torch.randn(T, 1, D, device=dev), cache, torch.randn(T, 1, D, device=dev),
        rope_cache(dev), index, index.flip(0),
    )  # fmt: skip


def _qknorm_rope_cache_in_q(dev):
    q, k = qk(dev)
    w = torch.ones(D, device=dev)
    sgljit.ops.qknorm_rope(q, k, w, w, q.view(-1, D), torch.arange(T, device=dev))


# (op call where a written tensor shares memory with one the op reads, the name the error gives,
# the other's name): the kernels would read what they are writing.
SHARED_WITH_READ = {
    "rmsnorm out shifted over input": (_rmsnorm_out_shifted, "out", "input"),
    "fused_add_rmsnorm weight in residual": (_fused_add_weight_in_residual, "residual", "weight"),
    "per_tensor_quant_fp8 out over input": (_per_tensor_out_over_input, "out", "input"),
    "per_token_quant_fp8 out over input": (_per_token_out_over_input, "out", "input"),
    "per_token_group_quant_fp8 out over input": (_group_out_over_input, "out", "input"),
    "timestep_embedding t in out": (_timestep_t_in_out, "out", "t"),
    "gelu_and_mul out over up": (_act_out_over_input, "out", "input"),
    "silu_and_mul_per_token_group_quant_fp8 out over input": (
        _act_quant_out_over_input,
        "out",
        "input",
    ),
    "apply_rope_with_kv_cache k in k_cache": (_kv_k_in_k_cache, "k_cache", "k"),
    "qknorm_rope cos_sin_cache in q": (_qknorm_rope_cache_in_q, "q", "cos_sin_cache"),
}


def backend_device(backend: str) -> tuple[str, object]:
    return ("cuda" if backend == "cuda" else "cpu"), sgljit.use_backend(backend)


@pytest.mark.parametrize("case", sorted(REFUSED_WRITES))
@pytest.mark.parametrize("backend", BACKENDS)
def test_a_written_tensor_whose_elements_overlap_is_refused(backend, case):
    call, name = REFUSED_WRITES[case]
    device, ctx = backend_device(backend)
    message = rf"^{name}: shares memory with " if case in PASSED_TWICE else rf"^{name}: "
    with ctx, pytest.raises(ValueError, match=message):
        call(device)


@pytest.mark.parametrize("case", sorted(SHARED_WITH_READ))
@pytest.mark.parametrize("backend", BACKENDS)
def test_a_written_tensor_sharing_memory_with_a_read_one_is_refused(backend, case):
    call, name, other = SHARED_WITH_READ[case]
    device, ctx = backend_device(backend)
    message = rf"^{name}: shares memory with {other}, which sgljit reads; pass a tensor of its own"
    with ctx, pytest.raises(ValueError, match=message):
        call(device)


@pytest.mark.parametrize("backend", BACKENDS)
def test_inputs_that_require_grad(backend):
    device, ctx = backend_device(backend)
    x = torch.randn(T, H, device=device, requires_grad=True)
    w = torch.randn(H, device=device)
    with ctx:
        if backend == "reference":  # the PyTorch reference keeps the graph
            assert sgljit.ops.rmsnorm(x, w).grad_fn is not None
            q = torch.randn(T, 2, D, device=device, requires_grad=True)
            k, index = torch.randn(T, 1, D, device=device), torch.arange(T, device=device)
            with pytest.raises(RuntimeError, match=r"^q: requires grad and is a leaf"):
                sgljit.ops.apply_rope(q, k, rope_cache(device), index)  # q is written in place
            sgljit.ops.apply_rope(q * 1, k, rope_cache(device), index)  # not a leaf: allowed
        else:
            with pytest.raises(RuntimeError, match=r"^input: requires grad.*inference-only"):
                sgljit.ops.rmsnorm(x, w)
            q, k = qk(device)
            with pytest.raises(RuntimeError, match=r"^k: requires grad"):
                sgljit.ops.apply_rope(
                    q, k.requires_grad_(), rope_cache(device), torch.arange(T, device=device)
                )
        with torch.no_grad():  # the way to call a kernel on such tensors
            y = sgljit.ops.rmsnorm(x, w)
    expected = x.double() * torch.rsqrt(x.double().pow(2).mean(-1, keepdim=True) + 1e-6) * w
    torch.testing.assert_close(y.double(), expected, rtol=1e-5, atol=1e-5)
