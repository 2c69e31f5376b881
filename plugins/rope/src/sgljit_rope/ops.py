"""Rotary position embedding: ``apply_rope`` and ``apply_rope_with_kv_cache``.

Both work in place and return None. Layout: q ``[T, Hq, D]``, k/v ``[T, Hk, D]`` (or flattened
``[T, H * D]``), possibly strided views into a fused qkv buffer (the last dim must be contiguous);
``cos_sin_cache`` float32 ``[max_pos, rotary_dim]`` with cos in the first half of a row and sin in
the second; ``positions`` int32/int64 ``[T]``. Math in float32.

Out-of-range indices never touch memory out of bounds: a position outside ``[0, max_pos)`` leaves
its token unrotated, an ``out_loc`` outside ``[0, num_slots)`` stores nothing for its token. With
``SGLJIT_CHECK_INDICES=1`` both are checked on the host first (a device sync; eager calls outside
CUDA-graph capture only) and an ``IndexError`` names the first bad index.
"""

import os
from pathlib import Path

import torch

import sgljit
from sgljit.jit_utils import as_dtype
from sgljit.op import kernel_op

from . import reference

__all__ = [
    "apply_rope",
    "apply_rope_with_kv_cache",
    "cuda_kv_module",
    "cuda_module",
    "prebuild",
    "prebuild_specs",
    "sycl_module",
]

_HERE = Path(__file__).resolve().parent
_FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
_INDEX_DTYPES = (torch.int32, torch.int64)


# ------------------------------------------------------------------------------------------------
# Module loaders (one specialization per dtype, index types, sizes, style and vector width)


@sgljit.cache_once
def cuda_module(dtype, idx_dtype, rotary_dim: int, is_neox: bool, vec: int):
    """CUDA module exporting ``apply_rope(q, k, cos_sin_cache, positions)``."""
    args = sgljit.make_cpp_args(as_dtype(dtype), as_dtype(idx_dtype), rotary_dim, is_neox, vec)
    return sgljit.load_jit(
        "rope",
        args,
        cuda_files=["rope.cuh"],
        cuda_wrappers=[("apply_rope", f"sgljit_rope::RopeKernel<{args}>::run")],
        source_dir=_HERE / "csrc",
    )


@sgljit.cache_once
def cuda_kv_module(
    dtype, idx_dtype, loc_dtype, head_dim: int, rotary_dim: int, is_neox: bool, vec: int
):
    """CUDA module exporting ``apply_rope_with_kv_cache(q, k, v, k_cache, v_cache, cache, pos, loc)``."""
    args = sgljit.make_cpp_args(
        as_dtype(dtype),
        as_dtype(idx_dtype),
        as_dtype(loc_dtype),
        head_dim,
        rotary_dim,
        is_neox,
        vec,
    )
    return sgljit.load_jit(
        "rope_kv",
        args,
        cuda_files=["rope.cuh"],
        cuda_wrappers=[("apply_rope_with_kv_cache", f"sgljit_rope::RopeKVKernel<{args}>::run")],
        source_dir=_HERE / "csrc",
    )


@sgljit.cache_once
def sycl_module(
    dtype, idx_dtype, loc_dtype, head_dim: int, rotary_dim: int, is_neox: bool, vec: int
):
    """SYCL module with kernels ``rope_apply`` and ``rope_apply_kv`` (see sycl/rope.hpp)."""
    t, i, lo = sgljit.make_cpp_args(as_dtype(dtype), as_dtype(idx_dtype), as_dtype(loc_dtype))
    return sgljit.load_jit_sycl(
        "rope",
        t,
        i,
        lo,
        head_dim,
        rotary_dim,
        "neox" if is_neox else "gptj",
        vec,
        sycl_files=[_HERE / "sycl" / "rope.hpp"],
        extra_sycl_cflags=[
            f"-DSGLJIT_T={t}",
            f"-DROPE_IDX_T={i}",
            f"-DROPE_LOC_T={lo}",
            f"-DROPE_HEAD_DIM={head_dim}",
            f"-DROPE_ROT={rotary_dim}",
            f"-DROPE_NEOX={int(is_neox)}",
            f"-DROPE_VEC={vec}",
        ],
    )


def prebuild_specs(backend: str) -> list[dict]:
    """Specializations a serving fleet needs on ``backend`` ("cuda" or "sycl"): bf16/fp16, common
    head sizes, int64 indices, full 16-byte vectors; build one with ``prebuild(backend, **spec)``.
    Each spec is ``{"op": ..., **loader arguments}`` (dtypes by name)."""
    specs: list[dict] = []
    for dtype in ("bfloat16", "float16"):
        for head_dim, rot in ((64, 64), (128, 128), (128, 64), (256, 256), (512, 64)):
            kv = dict(dtype=dtype, idx_dtype="int64", loc_dtype="int64", head_dim=head_dim,
                      rotary_dim=rot, vec=8)  # fmt: skip
            for is_neox in (True, False):
                if backend == "cuda":
                    specs.append(dict(op="apply_rope", dtype=dtype, idx_dtype="int64",
                                      rotary_dim=rot, is_neox=is_neox, vec=8))  # fmt: skip
                    if is_neox:
                        specs.append(dict(op="apply_rope_with_kv_cache", **kv, is_neox=True))
                elif backend == "sycl":
                    specs.append(dict(op="rope", **kv, is_neox=is_neox))
    out: list[dict] = []  # apply_rope does not depend on head_dim: drop repeats
    for spec in specs:
        if spec not in out:
            out.append(spec)
    return out


def prebuild(backend: str, op: str, **spec):
    """Build (or load from the cache) one ``prebuild_specs(backend)`` entry; returns the module."""
    loader = {
        ("cuda", "apply_rope"): cuda_module,
        ("cuda", "apply_rope_with_kv_cache"): cuda_kv_module,
        ("sycl", "rope"): sycl_module,
    }.get((backend, op))
    if loader is None:
        raise ValueError(f"prebuild: no {backend!r} module for op {op!r}")
    return loader(**spec)


# ------------------------------------------------------------------------------------------------
# Vector width: the widest (up to 16 bytes) every pointer, stride and size allows


def _fits(t: torch.Tensor, vec: int) -> bool:
    if t.data_ptr() % (vec * t.element_size()):
        return False
    return all(
        st % vec == 0 for st, sz in zip(t.stride()[:-1], t.shape[:-1], strict=True) if sz > 1
    )


def _pick_vec(tensors, cos_sin_cache: torch.Tensor, rotary_dim: int, head_dim: int) -> int:
    vec = 16 // tensors[0].element_size()
    while vec > 1:
        cvec = min(vec, 4)
        if (
            (rotary_dim // 2) % vec == 0
            and head_dim % vec == 0
            and all(_fits(t, vec) for t in tensors)
            and cos_sin_cache.data_ptr() % (cvec * 4) == 0
            and (cos_sin_cache.shape[0] <= 1 or cos_sin_cache.stride(0) % cvec == 0)
        ):
            return vec
        vec //= 2
    return 1


# ------------------------------------------------------------------------------------------------
# The ops (destination passing; the function bodies are the reference backend)


@kernel_op("apply_rope", mutates_args=("q", "k"))
def _apply_rope(
    q: torch.Tensor,
    k: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    positions: torch.Tensor,
    is_neox: bool,
) -> None:
    reference.apply_rope_into(q, k, cos_sin_cache, positions, is_neox)


@_apply_rope.register("cuda")
def _(q, k, cos_sin_cache, positions, is_neox):
    rot = cos_sin_cache.shape[1]
    vec = _pick_vec((q, k), cos_sin_cache, rot, rot)
    cuda_module(q.dtype, positions.dtype, rot, is_neox, vec).apply_rope(
        q, k, cos_sin_cache, positions
    )


def _sycl_geometry(num_items: int, rot: int, vec: int) -> tuple[int, int]:
    lanes = rot // 2 // vec
    local = lanes * max(1, 128 // lanes)
    groups = local // lanes
    return -(-num_items // groups) * local, local


@_apply_rope.register("sycl")
def _(q, k, cos_sin_cache, positions, is_neox):
    rot = cos_sin_cache.shape[1]
    vec = _pick_vec((q, k), cos_sin_cache, rot, rot)
    T, Hq, Hk = q.shape[0], q.shape[1], k.shape[1]
    chunks_q, chunks_k = -(-Hq // 4), -(-Hk // 4)
    items = T * (chunks_q + chunks_k)
    if items == 0:
        return
    mod = sycl_module(q.dtype, positions.dtype, torch.int64, rot, rot, is_neox, vec)
    fn = mod.get_function("rope_apply", ("ptr",) * 4 + ("i64",) * 11)
    g, loc = _sycl_geometry(items, rot, vec)
    fn(g, loc, q, k, cos_sin_cache, positions, items, chunks_q + chunks_k, chunks_q, Hq, Hk,
       q.stride(0), q.stride(1), k.stride(0), k.stride(1), cos_sin_cache.stride(0),
       cos_sin_cache.shape[0])  # fmt: skip


@kernel_op("apply_rope_with_kv_cache", mutates_args=("q", "k_cache", "v_cache"))
def _apply_rope_with_kv_cache(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    positions: torch.Tensor,
    out_loc: torch.Tensor,
    is_neox: bool,
) -> None:
    reference.apply_rope_with_kv_cache_into(
        q, k, v, k_cache, v_cache, cos_sin_cache, positions, out_loc, is_neox
    )


@_apply_rope_with_kv_cache.register("cuda")
def _(q, k, v, k_cache, v_cache, cos_sin_cache, positions, out_loc, is_neox):
    rot, head_dim = cos_sin_cache.shape[1], q.shape[2]
    vec = _pick_vec((q, k, v, k_cache, v_cache), cos_sin_cache, rot, head_dim)
    mod = cuda_kv_module(q.dtype, positions.dtype, out_loc.dtype, head_dim, rot, is_neox, vec)
    mod.apply_rope_with_kv_cache(q, k, v, k_cache, v_cache, cos_sin_cache, positions, out_loc)


@_apply_rope_with_kv_cache.register("sycl")
def _(q, k, v, k_cache, v_cache, cos_sin_cache, positions, out_loc, is_neox):
    rot, head_dim = cos_sin_cache.shape[1], q.shape[2]
    vec = _pick_vec((q, k, v, k_cache, v_cache), cos_sin_cache, rot, head_dim)
    T, Hq, Hk = q.shape[0], q.shape[1], k.shape[1]
    chunks_q, chunks_k = -(-Hq // 4), -(-Hk // 4)
    items = T * (chunks_q + 2 * chunks_k)
    if items == 0:
        return
    mod = sycl_module(q.dtype, positions.dtype, out_loc.dtype, head_dim, rot, is_neox, vec)
    fn = mod.get_function("rope_apply_kv", ("ptr",) * 8 + ("i64",) * 19)
    g, loc = _sycl_geometry(items, rot, vec)
    fn(g, loc, q, k, v, k_cache, v_cache, cos_sin_cache, positions, out_loc,
       items, chunks_q + 2 * chunks_k, chunks_q, chunks_k, Hq, Hk,
       q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
       k_cache.stride(0), k_cache.stride(1), v_cache.stride(0), v_cache.stride(1),
       cos_sin_cache.stride(0), cos_sin_cache.shape[0], k_cache.shape[0])  # fmt: skip


# ------------------------------------------------------------------------------------------------
# Validation (errors name the argument) and the public functions


def _require_tensor(x, name: str) -> None:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(x).__name__}")


def _heads_view(x: torch.Tensor, name: str, head_dim: int) -> torch.Tensor:
    """``x`` as [T, H, head_dim] (a view); ``x`` is [T, H, head_dim] or [T, H * head_dim]."""
    if x.dim() == 3:
        if x.shape[2] != head_dim:
            raise ValueError(f"{name}: head size {x.shape[2]} does not match head_dim {head_dim}")
    elif x.dim() == 2:
        if x.shape[1] % head_dim:
            raise ValueError(
                f"{name}: width {x.shape[1]} of a flattened [T, H * D] tensor is not a multiple "
                f"of head_dim {head_dim}"
            )
        x = x.unflatten(1, (x.shape[1] // head_dim, head_dim))
    else:
        raise ValueError(f"{name}: expected [T, H, D] or [T, H * D], got shape {tuple(x.shape)}")
    if x.shape[2] > 1 and x.stride(2) != 1:
        raise ValueError(f"{name}: the last dimension must be contiguous (stride 1)")
    return x


def _validate_common(q, k, cos_sin_cache, positions, rotary_dim, head_dim, is_neox):
    """Checks shared by both ops; returns (head_dim, rotary_dim)."""
    for x, name in ((q, "q"), (k, "k"), (cos_sin_cache, "cos_sin_cache"), (positions, "positions")):
        _require_tensor(x, name)
    if q.dtype not in _FLOAT_DTYPES:
        raise TypeError(f"q: dtype must be float16, bfloat16 or float32, got {q.dtype}")
    if k.dtype != q.dtype:
        raise TypeError(f"k: dtype must match q ({q.dtype}), got {k.dtype}")
    if cos_sin_cache.dtype != torch.float32:
        raise TypeError(f"cos_sin_cache: dtype must be float32, got {cos_sin_cache.dtype}")
    if cos_sin_cache.dim() != 2:
        raise ValueError(
            f"cos_sin_cache: expected [max_pos, rotary_dim], got shape {tuple(cos_sin_cache.shape)}"
        )
    if cos_sin_cache.shape[1] > 1 and cos_sin_cache.stride(1) != 1:
        raise ValueError("cos_sin_cache: the last dimension must be contiguous (stride 1)")
    if positions.dtype not in _INDEX_DTYPES:
        raise TypeError(f"positions: dtype must be int32 or int64, got {positions.dtype}")
    if positions.dim() != 1:
        raise ValueError(
            f"positions: expected a 1-D tensor [T], got shape {tuple(positions.shape)}"
        )
    if not isinstance(is_neox, bool):
        raise TypeError(f"is_neox: expected a bool, got {type(is_neox).__name__}")
    width = cos_sin_cache.shape[1]
    if rotary_dim is None:
        rotary_dim = width
    if not isinstance(rotary_dim, int) or isinstance(rotary_dim, bool):
        raise TypeError(f"rotary_dim: expected an int, got {type(rotary_dim).__name__}")
    if rotary_dim <= 0 or rotary_dim % 2:
        raise ValueError(f"rotary_dim: must be a positive even number, got {rotary_dim}")
    if rotary_dim != width:
        raise ValueError(
            f"rotary_dim: {rotary_dim} does not match the width of cos_sin_cache ({width})"
        )
    if cos_sin_cache.shape[0] == 0:
        raise ValueError(
            "cos_sin_cache: expected [max_pos, rotary_dim] with max_pos >= 1, got 0 rows"
        )
    if head_dim is None:
        shaped = [x.shape[-1] for x in (q, k) if x.dim() == 3]
        if not shaped:
            raise ValueError(
                f"head_dim: q and k are flattened [T, heads * head_dim], so the head size cannot be "
                f"read from them (with a cos_sin_cache of width {rotary_dim}, heads of {rotary_dim} "
                "and wider heads with partial rotary look alike); pass head_dim="
            )
        head_dim = shaped[0]
    if not isinstance(head_dim, int) or isinstance(head_dim, bool) or head_dim <= 0:
        raise ValueError(f"head_dim: expected a positive int, got {head_dim!r}")
    if rotary_dim > head_dim:
        raise ValueError(
            f"rotary_dim: {rotary_dim} exceeds head_dim {head_dim} (q's last dim or head_dim=)"
        )
    n = positions.shape[0]
    for x, name in ((q, "q"), (k, "k")):
        if x.dim() >= 1 and x.shape[0] != n:
            raise ValueError(
                f"{name}: has {x.shape[0]} tokens but positions has {n} (lengths must match)"
            )
    devices = {x.device for x in (q, k, cos_sin_cache, positions)}
    if len(devices) > 1:
        raise ValueError(
            f"q, k, cos_sin_cache and positions must be on one device, got {sorted(map(str, devices))}"
        )
    return head_dim, rotary_dim


def _check_indices(name: str, index: torch.Tensor, bound: int) -> None:
    """With SGLJIT_CHECK_INDICES=1 (eager, not while capturing a CUDA graph): raise IndexError
    naming the first index outside [0, bound). Synchronizes with the device."""
    if os.environ.get("SGLJIT_CHECK_INDICES", "0") in ("", "0"):
        return
    if index.is_cuda and torch.cuda.is_current_stream_capturing():
        return
    bad = ((index < 0) | (index >= bound)).nonzero()
    if bad.numel():
        i = int(bad[0, 0])
        raise IndexError(
            f"{name}[{i}] = {int(index[i])} is out of range [0, {bound}) "
            f"({bad.shape[0]} bad index(es); found because SGLJIT_CHECK_INDICES=1)"
        )


def apply_rope(
    q: torch.Tensor,
    k: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    positions: torch.Tensor,
    *,
    is_neox: bool = True,
    rotary_dim: int | None = None,
    head_dim: int | None = None,
) -> None:
    """Rotary embedding of q ``[T, Hq, D]`` and k ``[T, Hk, D]``, in place.

    ``cos_sin_cache`` float32 ``[max_pos, rotary_dim]`` (cos | sin), ``positions`` int32/int64
    ``[T]``. ``is_neox``: pairs ``(i, i + r/2)``, else gptj pairs ``(2i, 2i + 1)``. Only the first
    ``rotary_dim`` dims of each head rotate; the rest are untouched. ``rotary_dim`` defaults to
    the cache's width; ``head_dim`` is needed when q and k are both flattened ``[T, H * D]``
    (the head size cannot be read from them). q and k may be strided views (e.g. into a qkv
    buffer).
    """
    head_dim, _ = _validate_common(q, k, cos_sin_cache, positions, rotary_dim, head_dim, is_neox)
    q3, k3 = _heads_view(q, "q", head_dim), _heads_view(k, "k", head_dim)
    if positions.shape[0] == 0:
        return
    if not torch.compiler.is_compiling():
        _check_indices("positions", positions, cos_sin_cache.shape[0])
    _apply_rope(q3, k3, cos_sin_cache, positions.contiguous(), is_neox)


def apply_rope_with_kv_cache(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    positions: torch.Tensor,
    out_loc: torch.Tensor,
    *,
    is_neox: bool = True,
) -> None:
    """Rotary embedding with the KV-cache store fused in.

    q ``[T, Hq, D]`` is rotated in place; the rotated k and v ``[T, Hk, D]`` are written to
    ``k_cache[out_loc[t]]`` and ``v_cache[out_loc[t]]`` (caches ``[num_slots, Hk, D]``, or
    ``[num_slots, Hk * D]``). **k and v are left as they were** (k is not rotated in place).
    ``rotary_dim`` is the width of ``cos_sin_cache`` (partial rotary when it is below D: the other
    dims of k are copied unrotated). Duplicate ``out_loc`` values store in an unspecified order.
    """
    for x, name in ((v, "v"), (k_cache, "k_cache"), (v_cache, "v_cache"), (out_loc, "out_loc")):
        _require_tensor(x, name)
    head_dim = q.shape[-1] if isinstance(q, torch.Tensor) and q.dim() == 3 else None
    if head_dim is None and isinstance(k_cache, torch.Tensor) and k_cache.dim() == 3:
        head_dim = k_cache.shape[2]
    head_dim, _ = _validate_common(q, k, cos_sin_cache, positions, None, head_dim, is_neox)
    q3, k3 = _heads_view(q, "q", head_dim), _heads_view(k, "k", head_dim)
    if v.dtype != q.dtype:
        raise TypeError(f"v: dtype must match q ({q.dtype}), got {v.dtype}")
    v3 = _heads_view(v, "v", head_dim)
    if v3.shape != k3.shape:
        raise ValueError(f"v: shape {tuple(v.shape)} must match k's {tuple(k.shape)}")
    caches = []
    for c, name in ((k_cache, "k_cache"), (v_cache, "v_cache")):
        if c.dtype != q.dtype:
            raise TypeError(f"{name}: dtype must match q ({q.dtype}), got {c.dtype}")
        c3 = _heads_view(c, name, head_dim)
        if c3.shape[1] != k3.shape[1]:
            raise ValueError(
                f"{name}: expected [num_slots, {k3.shape[1]}, {head_dim}] (k's heads and head_dim), "
                f"got shape {tuple(c.shape)}"
            )
        caches.append(c3)
    if caches[0].shape[0] != caches[1].shape[0]:
        raise ValueError(
            f"v_cache: has {caches[1].shape[0]} slots but k_cache has {caches[0].shape[0]}"
        )
    if out_loc.dtype not in _INDEX_DTYPES:
        raise TypeError(f"out_loc: dtype must be int32 or int64, got {out_loc.dtype}")
    if out_loc.shape != positions.shape:
        raise ValueError(
            f"out_loc: expected shape {tuple(positions.shape)} (one slot per token), "
            f"got {tuple(out_loc.shape)}"
        )
    devices = {x.device for x in (q, v, k_cache, v_cache, out_loc)}
    if len(devices) > 1:
        raise ValueError(f"all tensors must be on one device, got {sorted(map(str, devices))}")
    if positions.shape[0] == 0:
        return
    if not torch.compiler.is_compiling():
        _check_indices("positions", positions, cos_sin_cache.shape[0])
        _check_indices("out_loc", out_loc, caches[0].shape[0])
    _apply_rope_with_kv_cache(
        q3, k3, v3, caches[0], caches[1], cos_sin_cache, positions.contiguous(),
        out_loc.contiguous(), is_neox,
    )  # fmt: skip


def check_cases(device: torch.device) -> list[dict]:
    """``sgljit check``: both ops on a few shapes, against float64 formulas written out here."""

    def rotate64(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, neox: bool) -> torch.Tensor:
        x = x.double()
        r = cos.shape[-1] * 2
        rot, rest = x[..., :r], x[..., r:]
        if neox:
            a, b = rot[..., : r // 2], rot[..., r // 2 :]
            out = torch.cat([a * cos - b * sin, b * cos + a * sin], -1)
        else:
            a, b = rot[..., 0::2], rot[..., 1::2]
            out = torch.stack([a * cos - b * sin, b * cos + a * sin], -1).flatten(-2)
        return torch.cat([out, rest], -1)

    def inputs(tokens: int, dtype: torch.dtype, rotary: int, head_dim: int = 128):
        q = torch.randn(tokens, 8, head_dim, device=device, dtype=dtype)
        k = torch.randn(tokens, 2, head_dim, device=device, dtype=dtype)
        angles = torch.rand(64, rotary // 2, device=device, dtype=torch.float64) * 6.3
        cache = torch.cat([angles.cos(), angles.sin()], -1).float()
        positions = torch.randint(0, 64, (tokens,), device=device)
        cos, sin = cache.double()[positions].chunk(2, -1)
        return q, k, cache, positions, cos[:, None], sin[:, None]

    cases = []
    for dtype, tol in ((torch.bfloat16, 2e-2), (torch.float16, 1e-2), (torch.float32, 1e-5)):
        name = str(dtype).removeprefix("torch.")
        for neox, rotary in ((True, 128), (False, 128), (True, 64)):

            def rope(dtype=dtype, neox=neox, rotary=rotary):
                q, k, cache, positions, cos, sin = inputs(7, dtype, rotary)
                expected = (rotate64(q, cos, sin, neox), rotate64(k, cos, sin, neox))
                apply_rope(q, k, cache, positions, is_neox=neox, rotary_dim=rotary)
                return (q, k), expected

            style = ("neox" if neox else "gptj") + (f" rotary {rotary}" if rotary != 128 else "")
            cases.append(
                {
                    "op": "apply_rope",
                    "shape": f"7x(8+2)x128 {style} {name}",
                    "run": rope,
                    "tol": tol,
                }
            )

        def with_cache(dtype=dtype):
            q, k, cache, positions, cos, sin = inputs(5, dtype, 128)
            v = torch.randn_like(k)
            k_cache = torch.full((16, 2, 128), float("nan"), device=device, dtype=dtype)
            v_cache = torch.full_like(k_cache, float("nan"))
            out_loc = torch.randperm(16, device=device)[:5]
            expected = (rotate64(q, cos, sin, True), rotate64(k, cos, sin, True), v.double())
            apply_rope_with_kv_cache(q, k, v, k_cache, v_cache, cache, positions, out_loc)
            return (q, k_cache[out_loc], v_cache[out_loc]), expected

        cases.append(
            {
                "op": "apply_rope_with_kv_cache",
                "shape": f"5x(8+2)x128 neox {name}",
                "run": with_cache,
                "tol": tol,
            }
        )
    return cases
