"""sgljit.compat's norm modules: the signatures and predicates of the libraries they stand in for
(sglang's read from its 0.5.13 wheel), and what sglang's own tests do not cover — FlashInfer's
functions, [T, heads, D] views, in-place calls, Hugging Face's rounding flag — on every backend."""

from __future__ import annotations

import ast
import contextlib
import inspect

import pytest
import torch

import sgljit
from sgljit.compat.flashinfer import norm as fi
from sgljit.compat.sglang import norm as sg
from sgljit.compat.sglang import rmsnorm_hf as sg_hf

from ..plugins.common import BACKENDS
from . import sglang_suite

BF16, FP16 = torch.bfloat16, torch.float16
TOL = {BF16: 2e-2, FP16: 4e-3}


@pytest.fixture(scope="module")
def sglang_modules(request, tmp_path_factory):
    """sglang's norm.py and rmsnorm_hf.py, parsed (not imported: they need sglang's runtime)."""
    dest = sglang_suite.sglang_files(request, tmp_path_factory, ["norm.py", "rmsnorm_hf.py"])
    return {m: ast.parse((dest / f"{m}.py").read_text()) for m in ("norm", "rmsnorm_hf")}


def _parameters(fn: ast.FunctionDef) -> list[tuple[str, str, object]]:
    """(name, kind, default) of each parameter of a parsed function."""
    a = fn.args
    positional = a.posonlyargs + a.args
    defaults = [inspect.Parameter.empty] * (len(positional) - len(a.defaults)) + [
        ast.literal_eval(d) for d in a.defaults
    ]
    out = [(p.arg, "positional", d) for p, d in zip(positional, defaults, strict=True)]
    out += [
        (p.arg, "keyword", inspect.Parameter.empty if d is None else ast.literal_eval(d))
        for p, d in zip(a.kwonlyargs, a.kw_defaults, strict=True)
    ]
    return out


def _our_parameters(fn) -> list[tuple[str, str, object]]:
    kinds = {inspect.Parameter.KEYWORD_ONLY: "keyword"}
    return [
        (p.name, kinds.get(p.kind, "positional"), p.default)
        for p in inspect.signature(fn).parameters.values()
    ]


@pytest.mark.parametrize(("module", "ours"), [("norm", sg), ("rmsnorm_hf", sg_hf)])
def test_sglang_public_functions_have_sglangs_signatures(sglang_modules, module, ours):
    functions = [
        node
        for node in sglang_modules[module].body
        if isinstance(node, ast.FunctionDef) and not node.name.startswith("_")
    ]
    assert functions
    for fn in functions:
        assert hasattr(ours, fn.name), f"sglang.jit_kernel.{module}.{fn.name} is missing"
        assert _our_parameters(getattr(ours, fn.name)) == _parameters(fn), fn.name
        assert fn.name in ours.__all__


@pytest.mark.parametrize(
    ("module", "predicate", "ours"),
    [
        ("norm", "_is_supported_rmsnorm_hidden_size", sg._is_supported_rmsnorm_hidden_size),
        (
            "norm",
            "is_supported_jit_fused_add_rmsnorm_hidden_size",
            sg.is_supported_jit_fused_add_rmsnorm_hidden_size,
        ),
        (
            "rmsnorm_hf",
            "is_supported_rmsnorm_hf_hidden_size",
            sg_hf.is_supported_rmsnorm_hf_hidden_size,
        ),
    ],
)
def test_sglang_width_predicates_answer_as_sglangs(sglang_modules, module, predicate, ours):
    """Call sites choose paths with them: sglang's own predicate (run from its source, with the
    module constants it reads) and ours agree on every width up to 20000."""
    tree = sglang_modules[module]
    keep = [
        node
        for node in tree.body
        if (isinstance(node, ast.FunctionDef) and node.name == predicate)
        or (
            isinstance(node, ast.Assign)
            and all(isinstance(t, ast.Name) and t.id.isupper() for t in node.targets)
        )
    ]
    namespace: dict = {}
    exec(compile(ast.Module(keep, type_ignores=[]), module, "exec"), namespace)
    theirs = namespace[predicate]
    assert [theirs(d) for d in range(20001)] == [ours(d) for d in range(20001)]


def test_flashinfer_functions_have_flashinfers_signatures():
    rows = [("input", "positional", inspect.Parameter.empty)]
    weight = [("weight", "positional", inspect.Parameter.empty)]
    eps, pdl = ("eps", "positional", 1e-6), ("enable_pdl", "positional", None)
    out = ("out", "positional", None)
    residual = [("residual", "positional", inspect.Parameter.empty)]
    assert _our_parameters(fi.rmsnorm) == [*rows, *weight, eps, out, pdl]
    assert _our_parameters(fi.gemma_rmsnorm) == [*rows, *weight, eps, out, pdl]
    assert _our_parameters(fi.fused_add_rmsnorm) == [*rows, *residual, *weight, eps, pdl]
    assert _our_parameters(fi.gemma_fused_add_rmsnorm) == [*rows, *residual, *weight, eps, pdl]


# ------------------------------------------------------------------------------------------------
# Semantics on every backend


@pytest.fixture
def on(request):
    """(device, context manager) of the test's backend."""
    backend = request.node.callspec.params["backend"]
    if backend == "cuda":
        return "cuda", contextlib.nullcontext
    return "cpu", lambda: sgljit.use_backend(backend)


def _randn(shape, dtype, device, seed):
    g = torch.Generator(device=device)
    g.manual_seed(seed)
    return torch.randn(shape, generator=g, device=device, dtype=torch.float32).to(dtype)


def _oracle(x, w, eps=1e-6, offset=0.0, round_to=None):
    xd = x.double()
    y = xd / torch.sqrt((xd * xd).mean(-1, keepdim=True) + eps)
    if round_to is not None:
        y = y.to(round_to).double()
    return y * (w.double() + offset)


def _close(actual, expected, dtype, what):
    assert not torch.isnan(actual).any(), f"{what}: NaN left"
    tol = TOL[dtype]
    torch.testing.assert_close(actual.double(), expected.double(), rtol=tol, atol=tol, msg=what)


def _hf_exact(actual, expected, what):
    """Hugging Face's roundings element by element: the same bits but where float32 and float64
    normalize to either side of a rounding boundary (rare)."""
    _close(actual, expected, actual.dtype, what)
    assert actual.ne(expected).double().mean().item() < 1e-3, what


@pytest.mark.parametrize("backend", BACKENDS)
def test_flashinfer_rmsnorm_2d_and_3d_views(backend, on):
    device, ctx = on
    t, heads, d = 7, 4, 128
    w = _randn((d,), BF16, device, 1)
    x = _randn((t, d), BF16, device, 2)
    with ctx():
        y = fi.rmsnorm(x, w)
        out = torch.full_like(x, float("nan"))
        assert fi.rmsnorm(x, w, 1e-5, out, True) is out
    _close(y, _oracle(x, w), BF16, "rmsnorm, out allocated")
    _close(out, _oracle(x, w, 1e-5), BF16, "rmsnorm into out")
    # FlashInfer's QK-norm use: [T, heads, D] strided views of a fused qkv buffer
    qkv = _randn((t, (heads + 2) * d + 8), BF16, device, 3)
    before = qkv.clone()
    q = qkv[:, : heads * d].view(t, heads, d)
    expected = _oracle(q, w)
    with ctx():
        y = fi.rmsnorm(q, w)
        assert fi.rmsnorm(q, w, out=q) is q
    assert y.shape == q.shape
    _close(y, expected, BF16, "rmsnorm of a [T, heads, D] view")
    _close(q, expected, BF16, "rmsnorm of a [T, heads, D] view, in place")
    assert torch.equal(qkv[:, heads * d :], before[:, heads * d :])


@pytest.mark.parametrize("backend", BACKENDS)
def test_flashinfer_gemma_and_fused_adds(backend, on):
    device, ctx = on
    t, h = 5, 256
    w = _randn((h,), FP16, device, 4)
    x, r = _randn((t, h), FP16, device, 5), _randn((t, h), FP16, device, 6)
    with ctx():
        y = fi.gemma_rmsnorm(x, w)
    _close(y, _oracle(x, w, offset=1.0), FP16, "gemma_rmsnorm")
    for fn, offset in ((fi.fused_add_rmsnorm, 0.0), (fi.gemma_fused_add_rmsnorm, 1.0)):
        xi, ri = x.clone(), r.clone()
        total = (x.double() + r.double()).to(FP16)
        with ctx():
            assert fn(xi, ri, w, 1e-6, None) is None
        torch.testing.assert_close(ri, total, rtol=0, atol=0)
        _close(xi, _oracle(total, w, offset=offset), FP16, fn.__name__)


@pytest.mark.parametrize("backend", BACKENDS)
def test_sglang_rmsnorm_without_out_is_in_place_and_the_hf_forms_round(backend, on):
    device, ctx = on
    t, h = 6, 512
    w = _randn((h,), BF16, device, 7)
    x = _randn((t, h), BF16, device, 8)
    xi = x.clone()
    with ctx():
        assert sg.rmsnorm(xi, w) is None
    _close(xi, _oracle(x, w), BF16, "sglang rmsnorm in place")
    out = torch.full_like(x, float("nan"))
    with ctx():
        assert sg.rmsnorm(x, w, out, 1e-5) is None
    _close(out, _oracle(x, w, 1e-5), BF16, "sglang rmsnorm into out")

    with ctx():
        y = sg_hf.rmsnorm_hf(x, w)
    _hf_exact(
        y, (_oracle(x, torch.ones_like(w), round_to=BF16) * w.double()).to(BF16), "rmsnorm_hf"
    )

    r = _randn((t, h), BF16, device, 9)
    total = (x.double() + r.double()).to(BF16)
    xi, ri = x.clone(), r.clone()
    with ctx():
        sg.fused_add_rmsnorm(xi, ri, w, 1e-6, cast_x_before_out_mul=True)
    exact_sum = x.double() + r.double()  # normalized unrounded, as sglang's kernel does
    expected = (_oracle(exact_sum, torch.ones_like(w), round_to=BF16) * w.double()).to(BF16)
    torch.testing.assert_close(ri, total, rtol=0, atol=0)
    _hf_exact(xi, expected, "fused_add_rmsnorm(cast_x_before_out_mul=True)")


@pytest.mark.parametrize("backend", BACKENDS)
def test_sglang_qknorms(backend, on):
    device, ctx = on
    t, d = 3, 128
    qkv = _randn((t, 12 * d), BF16, device, 10)
    q, k = qkv[:, : 8 * d].view(t, 8, d), qkv[:, 8 * d : 10 * d].view(t, 2, d)
    qw, kw = _randn((d,), BF16, device, 11), _randn((d,), BF16, device, 12)
    eq, ek = _oracle(q, qw), _oracle(k, kw)
    with ctx():
        sg.fused_inplace_qknorm(q, k, qw, kw, head_dim=d)
    _close(q, eq, BF16, "fused_inplace_qknorm q")
    _close(k, ek, BF16, "fused_inplace_qknorm k")
    with pytest.raises(ValueError, match=r"^head_dim: 64, but q's last dimension is 128"):
        sg.fused_inplace_qknorm(q, k, qw, kw, head_dim=64)
    q2, k2 = _randn((t, 1024), BF16, device, 13), _randn((t, 256), BF16, device, 14)
    qw2, kw2 = _randn((1024,), BF16, device, 15), _randn((256,), BF16, device, 16)
    eq, ek = _oracle(q2, qw2), _oracle(k2, kw2)
    with ctx():
        sg.fused_inplace_qknorm_across_heads(q2, k2, qw2, kw2)
    _close(q2, eq, BF16, "fused_inplace_qknorm_across_heads q")
    _close(k2, ek, BF16, "fused_inplace_qknorm_across_heads k")
    assert sg.can_use_fused_inplace_qknorm(128, BF16)
    assert not sg.can_use_fused_inplace_qknorm(96, BF16)
