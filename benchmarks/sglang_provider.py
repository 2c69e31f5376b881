"""sglang's JIT kernels as a benchmark provider, named ``sglang-jit``.

sglang's JIT kernels are the system sgljit replaces: CUDA kernels compiled at first use over
apache-tvm-ffi, shipped as Python and C++/CUDA sources inside the sglang wheels.
``benchmarks/fetch_sglang_jit.sh`` extracts them (with the few modules they import, some stubbed)
into ``.whl/sglang_jit`` at the repo root; ``SGLANG_JIT_PATH`` points elsewhere. Nothing is
installed: the folder goes first on ``sys.path`` when a loader runs. Kernels compile on first use
for the visible GPU, into sglang's cache (0.5.23: ``SGLANG_JIT_CACHE_DIR``, default
``~/.cache/sglang/jit``; 0.5.13: tvm-ffi's, ``TVM_FFI_CACHE_DIR``, default ``~/.cache/tvm-ffi``).

Two layouts, told apart by the fetched tree (:func:`layout`): sglang 0.5.23 and later ship
``sglang.kernels`` (public functions in ``ops/<area>/*.py`` over ``jit/``, and msgspec needed at
import); 0.5.13 and older ship ``sglang.jit_kernel``. :data:`OPS` maps each op to its module and
function in both; an op a release lacks is reported ``missing``.

Each ``load_*`` function returns ``fn(inputs)`` taking the inputs dict of the matching family script
(keys as there), or raises with the reason, which the harness reports as ``missing: <reason>``:
the tree is not there, there is no CUDA GPU (the kernels are CUDA only), or sglang has no such op.
Every returned function runs under ``torch.inference_mode()`` (sglang's custom-op fast path needs
grad off, as sgljit's kernels do). What is timed is what a user of sglang's public function must do
for the same result; where that does more or different work than sgljit's op, the loader says so.
``prepare_*`` functions add the buffers sglang needs and sgljit does not (untimed, once per copy).

Calling conventions mapped, sgljit's op on the left (0.5.23 ``sglang.kernels.ops.``; where 0.5.13's
``sglang.jit_kernel.`` differs, after "|"):

=========================  =====================================================================
rmsnorm                    layernorm.norm.rmsnorm(input, weight, out=None, eps); out=None: in place
fused_add_rmsnorm          layernorm.norm.fused_add_rmsnorm(input, residual, weight, eps, *,
                           cast_x_before_out_mul=False) (False: sglang's default rounding)
gemma_rmsnorm              layernorm.grouped_gemma_rmsnorm.grouped_gemma_rmsnorm(input, weight,
                           group_size=hidden, eps, out) (hidden a multiple of 512) | none
gemma_fused_add_rmsnorm    none (sglang's CUDA path takes it from the AOT sgl_kernel)
qknorm                     layernorm.norm.fused_inplace_qknorm(q, k, q_weight, k_weight, eps)
qknorm_across_heads        none in 0.5.23 | norm.fused_inplace_qknorm_across_heads(q, k, qw, kw, eps)
apply_rope                 attention.rope.apply_rope_inplace(q, k, cos_sin_cache, positions, *,
                           is_neox)
apply_rope_with_kv_cache   attention.rope.apply_rope_inplace_with_kvcache(q, k, v, k_cache,
                           v_cache, cos_sin_cache, positions, out_loc, *, is_neox)
qknorm_rope, cos/sin from  attention.fused_qknorm_rope.fused_qk_norm_rope(qkv, Hq, Hk, Hv, D, eps,
the rope base              qw, kw, base, is_neox, position_ids, factor, low, high,
                           attention_factor, rotary_dim) | fused_qknorm_rope.fused_qk_norm_rope
qknorm_rope, cos/sin table diffusion.rope.qknorm_rope_jit.fused_inplace_qknorm_rope(q, k, qw, kw,
                           cos_sin_cache, positions, *, is_neox, eps) | diffusion.qknorm_rope;
                           and (0.5.23, Triton) attention.table_qk_norm_rope.table_qk_norm_rope_(
                           qkv, positions, qw, kw, cos_sin_cache, Hq, Hk, D, eps) (neox, bf16)
per_tensor_quant_fp8       quantization.per_tensor_quant_fp8.per_tensor_quant_fp8(input, output_q,
                           output_s, is_static); dynamic: output_s must be zeroed first
per_token_quant_fp8        quantization.per_token_quant_fp8.per_token_quant_fp8(input, output_q,
                           output_s) | per_token_group_quant_8bit(input, output_q, output_s,
                           group_size=H, eps, fp8_min, fp8_max)
per_token_group_quant_fp8  quantization.per_token_group_quant.per_token_group_quant(input,
                           output_q, output_s, group_size) | per_token_group_quant_8bit(...);
                           output_s row- or column-major (picked from its strides)
silu_and_mul_per_token_    quantization.per_token_group_quant.per_token_group_quant(input,
group_quant_fp8            output_q, output_s, 128, fuse_silu_and_mul=True,
                           silu_and_mul_mode="dense") | dsv4.moe.silu_and_mul_contig_post_quant(
                           input, output, output_scale, 128)
timestep_embedding         diffusion.modulate.timestep_embedding_jit.timestep_embedding(t, dim,
                           flip_sin_to_cos, downscale_freq_shift, scale, max_period) -> new fp32
                           | timestep_embedding.timestep_embedding
silu_and_mul (and gelus)   activation.activation.silu_and_mul(input, out), gelu_and_mul,
                           gelu_tanh_and_mul (the CUDA backend of ops.activation's dispatcher)
=========================  =====================================================================

The rope, fp8 and activation ops are registered by sglang as torch custom ops
(``torch.ops.sglang.*``) and their public names are those ops, so an eager call goes through the
torch dispatcher; the norm and timestep functions are plain Python functions.
"""

from __future__ import annotations

import importlib
import os
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from harness import Provider

NAME = "sglang-jit"
ROOT = Path(__file__).resolve().parent.parent
DEFAULT_PATH = ROOT / ".whl" / "sglang_jit"
FETCH = "benchmarks/fetch_sglang_jit.sh"
FP8_MAX = 448.0  # torch.finfo(torch.float8_e4m3fn).max
PER_TOKEN_EPS = 1e-10  # sglang's default eps for per-token-group quantization

Inputs = dict[str, Any]
Fn = Callable[[Inputs], Any]


# Each op's module and function per layout (module relative to sglang.kernels.ops / sglang.jit_kernel);
# None: that release has no such op, with the reason.
OPS: dict[str, dict[str, tuple[str, str] | str]] = {
    "rmsnorm": {"kernels": ("layernorm.norm", "rmsnorm"), "jit_kernel": ("norm", "rmsnorm")},
    "fused_add_rmsnorm": {
        "kernels": ("layernorm.norm", "fused_add_rmsnorm"),
        "jit_kernel": ("norm", "fused_add_rmsnorm"),
    },
    "gemma_rmsnorm": {
        "kernels": ("layernorm.grouped_gemma_rmsnorm", "grouped_gemma_rmsnorm"),
        "jit_kernel": "gemma rmsnorm (sglang's gemma_rmsnorm is in the AOT sgl_kernel)",
    },
    "gemma_fused_add_rmsnorm": {
        "kernels": "gemma fused_add_rmsnorm (sglang's CUDA path takes it from the AOT sgl_kernel)",
        "jit_kernel": "gemma fused_add_rmsnorm (sglang's gemma norms are in the AOT sgl_kernel)",
    },
    "qknorm": {
        "kernels": ("layernorm.norm", "fused_inplace_qknorm"),
        "jit_kernel": ("norm", "fused_inplace_qknorm"),
    },
    "qknorm_across_heads": {
        "kernels": "qknorm across heads (removed in sglang 0.5.23)",
        "jit_kernel": ("norm", "fused_inplace_qknorm_across_heads"),
    },
    "apply_rope": {
        "kernels": ("attention.rope", "apply_rope_inplace"),
        "jit_kernel": ("rope", "apply_rope_inplace"),
    },
    "apply_rope_with_kv_cache": {
        "kernels": ("attention.rope", "apply_rope_inplace_with_kvcache"),
        "jit_kernel": ("rope", "apply_rope_inplace_with_kvcache"),
    },
    "fused_qk_norm_rope": {
        "kernels": ("attention.fused_qknorm_rope", "fused_qk_norm_rope"),
        "jit_kernel": ("fused_qknorm_rope", "fused_qk_norm_rope"),
    },
    "qknorm_rope": {
        "kernels": ("diffusion.rope.qknorm_rope_jit", "fused_inplace_qknorm_rope"),
        "jit_kernel": ("diffusion.qknorm_rope", "fused_inplace_qknorm_rope"),
    },
    "table_qk_norm_rope": {
        "kernels": ("attention.table_qk_norm_rope", "table_qk_norm_rope_"),
        "jit_kernel": "cos/sin-table qknorm+rope on the qkv buffer (new in sglang 0.5.23)",
    },
    "per_tensor_quant_fp8": {
        "kernels": ("quantization.per_tensor_quant_fp8", "per_tensor_quant_fp8"),
        "jit_kernel": ("per_tensor_quant_fp8", "per_tensor_quant_fp8"),
    },
    "per_token_quant_fp8": {
        "kernels": ("quantization.per_token_quant_fp8", "per_token_quant_fp8"),
        "jit_kernel": ("per_token_group_quant_8bit", "per_token_group_quant_8bit"),
    },
    "per_token_group_quant_fp8": {
        "kernels": ("quantization.per_token_group_quant", "per_token_group_quant"),
        "jit_kernel": ("per_token_group_quant_8bit", "per_token_group_quant_8bit"),
    },
    "silu_and_mul_per_token_group_quant_fp8": {
        "kernels": ("quantization.per_token_group_quant", "per_token_group_quant"),
        "jit_kernel": ("dsv4.moe", "silu_and_mul_contig_post_quant"),
    },
    "timestep_embedding": {
        "kernels": ("diffusion.modulate.timestep_embedding_jit", "timestep_embedding"),
        "jit_kernel": ("timestep_embedding", "timestep_embedding"),
    },
    **{
        f"{act}_and_mul": {
            "kernels": ("activation.activation", f"{act}_and_mul"),
            "jit_kernel": ("activation", f"{act}_and_mul"),
        }
        for act in ("silu", "gelu", "gelu_tanh")
    },
}
PACKAGES = {"kernels": "sglang.kernels.ops", "jit_kernel": "sglang.jit_kernel"}


def path() -> Path:
    """The fetched tree: ``$SGLANG_JIT_PATH``, else ``.whl/sglang_jit`` at the repo root."""
    given = os.environ.get("SGLANG_JIT_PATH")
    return Path(given).expanduser().resolve() if given else DEFAULT_PATH


def _shown(p: Path) -> str:
    try:
        return str(p.relative_to(ROOT))
    except ValueError:
        return str(p)


def version() -> str | None:
    """sglang's version of the fetched tree (from its SOURCE.txt), or None when there is none."""
    try:
        text = (path() / "SOURCE.txt").read_text()
    except OSError:
        return None
    m = re.search(r"^wheel: sglang-([^-]+)-", text, re.MULTILINE)
    return m.group(1) if m else "unknown"


def layout() -> str | None:
    """The fetched tree's layout: ``"kernels"`` (sglang.kernels, 0.5.23 and later), ``"jit_kernel"``
    (0.5.13 and older), or None when there is no tree."""
    root = path() / "sglang"
    if (root / "kernels" / "jit").is_dir():
        return "kernels"
    if (root / "jit_kernel").is_dir():
        return "jit_kernel"
    return None


def resolve(op: str, *, need_gpu: bool = True) -> Callable[..., Any]:
    """sglang's function for ``op`` (a key of :data:`OPS`) imported from the fetched tree; raises
    with the reason: no tree, no CUDA GPU (unless ``need_gpu`` is False: the kernels' modules
    import without one and fail only when a kernel is called), or no such op in this release."""
    kind = layout()
    if kind is None:
        raise FileNotFoundError(
            f"no sglang kernels in {_shown(path())} (run {FETCH}, or set SGLANG_JIT_PATH)"
        )
    if need_gpu and not torch.cuda.is_available():
        raise RuntimeError("sglang's JIT kernels are CUDA only and no CUDA GPU is visible")
    where = OPS[op][kind]
    if isinstance(where, str):
        raise NotImplementedError(f"sglang {version()} has no {where}")
    module, name = where
    return getattr(_import(f"{PACKAGES[kind]}.{module}"), name)


def _import(name: str):
    root = path()
    if str(root) not in sys.path:
        sys.path.insert(0, str(root))
    if name == "sglang.jit_kernel.dsv4.moe":
        _enter_without_init("sglang.jit_kernel.dsv4")
    module = importlib.import_module(name)
    origin = Path(sys.modules["sglang"].__file__).resolve().parent.parent
    if origin != root:
        raise ImportError(f"sglang was already imported from {origin}, not from {_shown(root)}")
    return module


def _enter_without_init(package: str) -> None:
    """0.5.13's ``sglang.jit_kernel.dsv4``: its ``__init__`` imports sglang's server (absent from the
    fetched tree), so the package is entered without running it; dsv4/moe.py itself needs only
    ``jit_kernel.utils`` and the package's ``utils``."""
    import types

    importlib.import_module("sglang.jit_kernel.utils")
    if package not in sys.modules:
        module = types.ModuleType(package)
        module.__path__ = [str(path() / Path(*package.split(".")))]
        sys.modules[package] = module


def provider(
    load: Callable[[], Fn],
    prepare: Callable[[Inputs], Inputs] | None = None,
    name: str = NAME,
) -> Provider:
    """The harness provider ``sglang-jit`` (or ``name``, for a second sglang kernel of one op) for
    one loader; the loaded function runs under ``torch.inference_mode()``."""

    def load_inference_mode() -> Fn:
        fn = load()

        def call(i: Inputs):
            with torch.inference_mode():
                return fn(i)

        return call

    return Provider(name, load_inference_mode, prepare)


# ------------------------------------------------------------------------------------------------
# norm: inputs x, w, out (rmsnorm); x, r, w (fused add); q, k, qw, kw (qknorm)


def load_rmsnorm(eps: float = 1e-6) -> Fn:
    """``rmsnorm(x, w, out, eps)`` into ``inputs["out"]``; without an ``out`` (or None) sglang
    normalizes ``x`` in place (its ``out=None`` means ``out = input``), where sgljit's rmsnorm
    without ``out`` allocates a new tensor. input ``[N, D]`` (2-D, last dim contiguous), D in
    {64, 128, 256} or a multiple of 256 up to 16384."""
    f = resolve("rmsnorm")
    return lambda i: f(i["x"], i["w"], i.get("out"), eps)


def load_fused_add_rmsnorm(eps: float = 1e-6) -> Fn:
    """``fused_add_rmsnorm(x, r, w, eps)``, in place like sgljit's (residual <- x + r, x <-
    rmsnorm(residual)). Same traffic; numerics differ slightly: sglang takes the sum of squares of
    the fp32 sum and normalizes the sum rounded to the dtype. Needs contiguous rows and hidden
    <= 8192 (12288 where the GPU has 32-byte vector loads); larger hidden sizes fail. 0.5.23's
    ``cast_x_before_out_mul`` (round the normalized sum to the dtype before the weight multiply,
    as HF's Llama does) is left at sglang's default, False: one rounding, after the multiply."""
    f = resolve("fused_add_rmsnorm")
    return lambda i: f(i["x"], i["r"], i["w"], eps)


def load_gemma_rmsnorm(eps: float = 1e-6) -> Fn:
    """0.5.23's ``grouped_gemma_rmsnorm(x, w, group_size=hidden, eps, out)``: one group spanning the
    row is a plain Gemma RMSNorm (``x * rsqrt(mean(x^2) + eps) * (1 + w)``) into
    ``inputs["out"]`` (allocated when absent); bf16/fp16, hidden a multiple of 512 (others fail)."""
    f = resolve("gemma_rmsnorm")
    return lambda i: f(i["x"], i["w"], i["x"].shape[-1], eps, i.get("out"))


def load_gemma_fused_add_rmsnorm(eps: float = 1e-6) -> Fn:
    return resolve("gemma_fused_add_rmsnorm")  # raises: no JIT kernel in any release


def load_qknorm(eps: float = 1e-6) -> Fn:
    """``fused_inplace_qknorm(q, k, qw, kw, eps)``: q ``[T, Hq, D]``, k ``[T, Hk, D]`` in place
    (strided rows allowed), one weight ``[D]`` each; D in {64, 128, 256, 512, 1024}."""
    f = resolve("qknorm")
    return lambda i: f(i["q"], i["k"], i["qw"], i["kw"], eps)


def load_qknorm_across_heads(eps: float = 1e-6) -> Fn:
    """``fused_inplace_qknorm_across_heads(q, k, qw, kw, eps)``, in place over whole rows. Unlike
    sgljit's, q and k must have the *same* width and contiguous rows: a GQA shape (q 4096, k 1024
    wide) or views into a fused qkv buffer are refused by its checks (reported as failed)."""
    f = resolve("qknorm_across_heads")
    return lambda i: f(i["q"], i["k"], i["qw"], i["kw"], eps)


# ------------------------------------------------------------------------------------------------
# rope: inputs q, k, cache, pos, is_neox; KV variant q, k, v, k_cache, v_cache, cache, pos, loc


def load_apply_rope() -> Fn:
    """``apply_rope_inplace(q, k, cos_sin_cache, positions, is_neox=...)``: q ``[T, Hq, D]`` and
    k ``[T, Hk, D]`` rotated in place, fp32 cache ``[max_pos, rope_dim]`` (cos | sin), int32/int64
    positions; the rope dim is the cache's width (compiled in). Same work as sgljit's."""
    f = resolve("apply_rope")
    return lambda i: f(i["q"], i["k"], i["cache"], i["pos"], is_neox=i["is_neox"])


def prepare_rotary_views(i: Inputs) -> Inputs:
    """Partial rotary (cache narrower than the head): ``apply_rope_inplace`` takes q and k of the
    rope dim's width, so it is given views of the first ``rotary_dim`` dims of each head (the same
    memory and the same work as sgljit's; the rest of each head is left as it is)."""
    rot = i["cache"].shape[-1]
    if rot == i["q"].shape[-1]:
        return i
    return {**i, "q": i["q"][..., :rot], "k": i["k"][..., :rot]}


def prepare_kv_cache_2d(i: Inputs) -> Inputs:
    """sglang's fused store takes caches ``[slots, Hk * D]`` only: 2-D views of the same memory."""
    return {**i, "k_cache": i["k_cache"].flatten(1), "v_cache": i["v_cache"].flatten(1)}


def load_apply_rope_with_kv_cache() -> Fn:
    """``apply_rope_inplace_with_kvcache(q, k, v, k_cache, v_cache, cache, pos, out_loc,
    is_neox=True)`` (caches 2-D: use :func:`prepare_kv_cache_2d`; out_loc of positions' dtype;
    rope dim must equal the head dim).

    More work than sgljit's: sglang also writes the rotated k back into ``k`` (k is rotated in place
    *and* stored), where sgljit leaves k untouched and only stores it: T x Hk x D more elements
    written per call, which the family's byte count (sgljit's contract) does not include."""
    f = resolve("apply_rope_with_kv_cache")
    return lambda i: f(
        i["q"], i["k"], i["v"], i["k_cache"], i["v_cache"], i["cache"], i["pos"], i["loc"],
        is_neox=True,
    )  # fmt: skip


# ------------------------------------------------------------------------------------------------
# qknorm_rope: inputs qkv (the fused buffer), q, k (views into it), qw, kw, cache, pos, is_neox,
# hq, hk, base (the cache's rope base)


def prepare_qkv_int32(i: Inputs) -> Inputs:
    """The int32 positions sglang's ``fused_qk_norm_rope`` takes (it refuses int64)."""
    return {**i, "pos32": i["pos"].to(torch.int32)}


def load_fused_qk_norm_rope(eps: float = 1e-6) -> Fn:
    """``fused_qk_norm_rope(qkv, Hq, Hk, Hv, D, eps, qw, kw, base, is_neox, pos32, factor=1, ...)``
    (TensorRT-LLM's kernel): RMSNorm and rope of q and k in place in the contiguous qkv buffer
    (Hv = Hk; bf16 only, int32 positions: :func:`prepare_qkv_int32`). A warp a head, 8-byte
    accesses at head_dim 128. Different work from sgljit's: cos/sin are computed from ``base``
    (``__sincosf`` of position x frequency) instead of read from the cache, so it reads T x 512 B
    less than the family's byte count, and its angles are fast-math ones; it rounds once, after the
    rotation (sgljit rounds the normalized head too, as qknorm then apply_rope do). No bounds on
    positions."""
    f = resolve("fused_qk_norm_rope")

    def fn(i):
        d = i["q"].shape[-1]
        return f(
            i["qkv"], i["hq"], i["hk"], i["hk"], d, eps, i["qw"], i["kw"], i["base"],
            i["is_neox"], i["pos32"], 1.0, 0.0, 0.0, 1.0, i["cache"].shape[-1],
        )  # fmt: skip

    return fn


def load_qknorm_rope(eps: float = 1e-6) -> Fn:
    """``diffusion.qknorm_rope.fused_inplace_qknorm_rope(q, k, qw, kw, cache, pos, is_neox=, eps=)``:
    the same contract as sgljit's (views of one head stride, fp32 cos/sin cache, int32/int64
    positions, in place), bf16/fp16, head_dim 64/128/256. A warp a head (8-byte accesses at 128),
    a persistent grid; rounds once, after the rotation (sgljit also rounds the normalized head, as
    qknorm then apply_rope do); no bounds check on positions."""
    f = resolve("qknorm_rope")
    return lambda i: f(
        i["q"], i["k"], i["qw"], i["kw"], i["cache"], i["pos"], is_neox=i["is_neox"], eps=eps
    )


def load_table_qk_norm_rope(eps: float = 1e-6) -> Fn:
    """0.5.23's ``table_qk_norm_rope_(qkv, pos, qw, kw, cache, Hq, Hk, D, eps)`` (Triton): RMSNorm
    and neox rope of q and k in place in the fused qkv buffer, cos/sin read from the same fp32 cache
    as sgljit's (full rotary only: the cache as wide as the head). A program per (token, head),
    bf16 only; rounds the normalized head to bf16 before the rotation, as sgljit does. No bounds
    check on positions; GPT-J (interleaved) rope is refused here, as sglang has none."""
    f = resolve("table_qk_norm_rope")

    def fn(i):
        d = i["q"].shape[-1]
        if not i["is_neox"] or i["cache"].shape[-1] != d:
            raise ValueError("table_qk_norm_rope_: neox rope over the whole head only")
        return f(i["qkv"], i["pos"], i["qw"], i["kw"], i["cache"], i["hq"], i["hk"], d, eps)

    return fn


# ------------------------------------------------------------------------------------------------
# fp8 quantization: inputs x, out (and scale for static)


def load_per_tensor_quant_fp8_static() -> Fn:
    """``per_tensor_quant_fp8(x, out, scale, is_static=True)``: ``out = clip(x * (1 / scale))``
    (a multiply by the reciprocal, where sgljit divides: results may differ by one fp8 step).
    Contiguous input (it is viewed 1-D); e4m3 output only. Same traffic as sgljit's."""
    f = resolve("per_tensor_quant_fp8")
    return lambda i: f(i["x"], i["out"], i["scale"], True)


def prepare_dynamic_scale(i: Inputs) -> Inputs:
    """The fp32 ``[1]`` scale buffer sglang's dynamic quantization writes (sgljit allocates its
    own scale inside the call)."""
    return {**i, "sglang_scale": torch.empty(1, dtype=torch.float32, device=i["x"].device)}


def load_per_tensor_quant_fp8_dynamic() -> Fn:
    """``scale.zero_()`` then ``per_tensor_quant_fp8(x, out, scale, is_static=False)``.

    The timed call includes zeroing the scale (a fill kernel): sglang's absmax pass folds each
    block's maximum into ``output_s`` with an atomic max, so the buffer must start at 0 on every
    call (sglang's own caller allocates ``torch.zeros(1)`` per call). Then two kernels: absmax
    (reads x) and quantize (reads x again). Scale ``absmax / 448`` with no lower bound (sgljit's
    is at least 2^-126; an all-zero input gives sglang a scale of 0, then 1 / 0); quantize
    multiplies by the reciprocal. Needs :func:`prepare_dynamic_scale`."""
    f = resolve("per_tensor_quant_fp8")

    def fn(i):
        s = i["sglang_scale"]
        s.zero_()
        f(i["x"], i["out"], s, False)

    return fn


def prepare_per_token_scales(i: Inputs) -> Inputs:
    """The fp32 ``[T, 1]`` scales buffer sglang writes (sgljit allocates its own inside the call)."""
    x = i["x"]
    return {**i, "sglang_scales": torch.empty(x.shape[0], 1, dtype=torch.float32, device=x.device)}


def load_per_token_quant_fp8(eps: float = PER_TOKEN_EPS) -> Fn:
    """0.5.23: ``per_token_quant_fp8(x, out, scales)``, sglang's per-token kernel (compiled with
    ``--use_fast_math`` on sm_90). 0.5.13 has per-token-*group* quantization only:
    ``per_token_group_quant_8bit(x, out, scales, group_size=H, eps, -448, 448)``, one group spanning
    the row (16 threads a group, the group read twice; scale ``max(absmax, eps) / 448`` with
    sglang's default eps 1e-10, where sgljit's is ``max(absmax / 448, 2^-126)``). Row-major
    contiguous ``[T, H]``. Needs :func:`prepare_per_token_scales`."""
    f = resolve("per_token_quant_fp8")
    if layout() == "kernels":
        return lambda i: f(i["x"], i["out"], i["sglang_scales"])

    def fn(i):
        x = i["x"]
        return f(x, i["out"], i["sglang_scales"], x.shape[-1], eps, -FP8_MAX, FP8_MAX)

    return fn


def load_per_token_group_quant_fp8(eps: float = PER_TOKEN_EPS, group_size: int = 128) -> Fn:
    """Into the inputs' ``out`` and ``scales`` (fp32 ``[T, H / group_size]``, row-major or
    column-major: the kernel picks the layout from the strides). 0.5.23:
    ``per_token_group_quant(x, out, scales, group_size)`` (its eps is fixed: ``eps`` is not
    passed); 0.5.13: ``per_token_group_quant_8bit(x, out, scales, group_size, eps, -448, 448)``.
    Same traffic as sgljit's. Scale ``max(absmax, eps) / 448`` (sgljit: ``max(absmax / 448,
    eps)``; equal unless absmax < 448 * eps); x / scale like sgljit. Contiguous ``[T, H]`` only."""
    f = resolve("per_token_group_quant_fp8")
    if layout() == "kernels":
        return lambda i: f(i["x"], i["out"], i["scales"], group_size)
    return lambda i: f(i["x"], i["out"], i["scales"], group_size, eps, -FP8_MAX, FP8_MAX)


# ------------------------------------------------------------------------------------------------
# timestep embedding: inputs t, dim, out


def load_timestep_embedding(flip_sin_to_cos: bool = False, downscale_freq_shift: float = 0.0) -> Fn:
    """``timestep_embedding(t, dim, flip_sin_to_cos, downscale_freq_shift)``; scale 1 and
    max_period 10000 (both defaults). It always allocates and returns a new fp32 ``[B, dim]``
    (no ``out=``), and dim must be a multiple of 8. For an fp16/bf16 ``inputs["out"]`` the result
    is cast with ``.to(dtype)``: an extra kernel, and the embedding written in fp32 then read
    again, where sgljit writes the narrow dtype once. The returned tensor is not copied into
    ``out`` (sgljit writes there)."""
    f = resolve("timestep_embedding")

    def fn(i):
        y = f(i["t"], i["dim"], flip_sin_to_cos, downscale_freq_shift)
        out = i.get("out")
        return y if out is None or out.dtype == torch.float32 else y.to(out.dtype)

    return fn


# ------------------------------------------------------------------------------------------------
# gated activations: inputs x ([T, 2d], gate then up), out ([T, d]); the fused fp8 form: out (fp8),
# scales (fp32 [T, d / 128])


def load_act_and_mul(act: str) -> Fn:
    """``activation.<act>_and_mul(x, out)`` (act: silu, gelu, gelu_tanh): the same contract as
    sgljit's (fp32 math, one rounding), compiled with ``--use_fast_math`` on sm_90 (sglang's
    policy: fast ``expf``, ``erff``, ``tanhf`` and division). One 16-byte vector a thread, 256-thread
    blocks, a flat grid; needs contiguous rows and d a multiple of 16 bytes."""
    f = resolve(f"{act}_and_mul")
    return lambda i: f(i["x"], i["out"])


def load_silu_and_mul_quant_fp8() -> Fn:
    """SiLU-and-mul fused with per-token-group (128) e4m3 quantization into ``out`` (fp8) and
    ``scales`` (fp32, row-major). 0.5.23: ``per_token_group_quant(x, out, scales, 128,
    fuse_silu_and_mul=True, silu_and_mul_mode="dense")``: fp32 SiLU and multiply, rounded once to
    the input dtype, then quantized (sgljit quantizes the fp32 product unrounded), bf16/fp16.
    0.5.13: DeepSeek-V4's ``dsv4.moe.silu_and_mul_contig_post_quant(x, out, scales, 128)``, bf16
    only, d at most 8192 (one block a row; larger d fails). Both: scale ``max(absmax, 1e-10) / 448``, and sglang's
    codes may differ from sgljit's by one step where it multiplies by the reciprocal."""
    f = resolve("silu_and_mul_per_token_group_quant_fp8")
    if layout() == "kernels":
        return lambda i: f(
            i["x"], i["out"], i["scales"], 128, fuse_silu_and_mul=True, silu_and_mul_mode="dense"
        )
    return lambda i: f(i["x"], i["out"], i["scales"], 128)


# ------------------------------------------------------------------------------------------------
# per-token-group over the MoE layouts: sglang 0.5.23's ``per_token_group_quant`` (its
# ``sglang.kernels`` tree; kept apart from the mappings above, which follow the fetched tree's
# ``jit_kernel`` layout). Inputs of bench_quant_fp8.py's masked and sorted cases.


def _kernels_module(name: str):
    """``sglang.kernels.<name>`` (sglang 0.5.23's layout) from the fetched tree; raises with the
    reason."""
    if layout() != "kernels":
        raise FileNotFoundError(
            f"no sglang 0.5.23 kernels tree in {_shown(path())} (run {FETCH}, or set SGLANG_JIT_PATH)"
        )
    if not torch.cuda.is_available():
        raise RuntimeError("sglang's kernels are CUDA only and no CUDA GPU is visible")
    return _import(f"sglang.kernels.{name}")


def load_per_token_group_quant_moe(layout: str, group_size: int = 128) -> Fn:
    """``per_token_group_quant(x, out, scales, group_size, masked_m=, expected_m=)`` (masked) or
    ``(..., sorted_token_ids=, num_tokens_post_padded=, num_valid_tokens=)`` (sorted): fp8 e4m3,
    fp32 scales in the layout of the ``scales`` buffer, eps 1e-10 (fixed there)."""
    f = _kernels_module("ops.quantization.per_token_group_quant").per_token_group_quant
    if layout == "masked":
        return lambda i: f(
            i["x"], i["out"], i["scales"], group_size, masked_m=i["masked_m"],
            expected_m=i["expected_m"],
        )  # fmt: skip
    return lambda i: f(
        i["x"], i["out"], i["scales"], group_size, sorted_token_ids=i["ids"],
        num_tokens_post_padded=i["post"], num_valid_tokens=i["valid"],
    )  # fmt: skip


def load_silu_and_mul_sorted(block: int) -> Fn:
    """``silu_and_mul(x, out, expert_ids, block, sorted_token_ids=, num_tokens_post_padded=,
    num_valid_tokens=)`` (sglang 0.5.23's ``sglang.kernels.ops.activation.activation``): padding
    rows and blocks of expert -1 skipped."""
    f = _kernels_module("ops.activation.activation").silu_and_mul
    return lambda i: f(
        i["x"], i["out"], i["expert_ids"], block, sorted_token_ids=i["ids"],
        num_tokens_post_padded=i["post"], num_valid_tokens=i["valid"],
    )  # fmt: skip
