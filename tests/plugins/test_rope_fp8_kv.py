"""sgljit-rope's fp8 KV ops (rope_fp8, rope_fp8_append_paged, paged_kv_append): what the
conformance suite does not cover — their CUDA kernels compile for sm_90a and sm_100a on a machine
without a GPU, and the page-table check. Numerics, bad inputs, empty batches, torch.compile and CUDA
graphs come from their declared cases (test_conformance.py); the public functions' tests on every
backend are tests/compat/test_compat_page.py."""

from __future__ import annotations

import contextlib

import pytest
import torch

import sgljit

from .common import BACKENDS, HAS_CUDA

pytest.importorskip("sgljit_rope")

from sgljit_rope import fp8_kv

# One module per distinct path: bf16 -> e4m3 neox int64 (the prebuilt ones), fp16 -> e5m2 gptj
# int32 (paged), and the plain append's 1-, 2- and 4-byte elements.
SPECS = [
    {"op": "rope_fp8", "dtype": torch.bfloat16, "fp8_dtype": torch.float8_e4m3fn,
     "idx_dtype": torch.int64, "is_neox": True},
    {"op": "rope_fp8_append_paged", "dtype": torch.float16, "fp8_dtype": torch.float8_e5m2,
     "idx_dtype": torch.int32, "is_neox": False},
    {"op": "rope_fp8_append_paged", "dtype": torch.bfloat16, "fp8_dtype": torch.float8_e4m3fn,
     "idx_dtype": torch.int64, "is_neox": True},
    {"op": "paged_kv_append", "bytes": 1},
    {"op": "paged_kv_append", "bytes": 2},
    {"op": "paged_kv_append", "bytes": 4},
]  # fmt: skip


def test_cuda_compiles_for_sm90a_and_sm100a(tmp_path, monkeypatch):
    from sgljit.toolchain import find_nvcc

    if find_nvcc() is None:
        pytest.skip("nvcc not found")
    if HAS_CUDA:
        pytest.skip("the GPU tests build these modules for the GPU's own arch")
    monkeypatch.setenv("SGLJIT_CUDA_ARCH", "9.0a 10.0a")
    monkeypatch.setenv("SGLJIT_CACHE_DIR", str(tmp_path / "cache"))
    sgljit.clear_module_cache()
    try:
        for spec in SPECS:
            spec = dict(spec)
            op = spec.pop("op")
            assert getattr(fp8_kv.family.prebuild("cuda", op, **spec), op) is not None
    finally:
        sgljit.clear_module_cache()


def _table(device):
    kv_indptr = torch.tensor([0, 2, 3], dtype=torch.int32, device=device)
    kv_indices = torch.tensor([4, 0, 2], dtype=torch.int32, device=device)
    last = torch.tensor([3, 4], dtype=torch.int32, device=device)
    batch = torch.tensor([0, 0, 1], dtype=torch.int32, device=device)
    positions = torch.tensor([5, 6, 3], dtype=torch.int32, device=device)
    return kv_indices, kv_indptr, last, batch, positions


def test_check_page_table_accepts_a_good_table():
    fp8_kv.check_page_table(*_table("cpu"), num_pages=5, page_size=4)


@pytest.mark.parametrize(
    ("name", "spoil"),
    [
        ("kv_indptr", lambda t: t[1].copy_(torch.tensor([0, 3, 2]))),
        ("kv_indptr", lambda t: t[1].copy_(torch.tensor([0, 2, 4]))),  # past kv_indices
        ("kv_indices", lambda t: t[0].__setitem__(1, 5)),
        ("kv_indices", lambda t: t[0].__setitem__(2, -1)),
        ("kv_last_page_len", lambda t: t[2].__setitem__(0, 0)),
        ("kv_last_page_len", lambda t: t[2].__setitem__(1, 5)),
        ("batch_indices", lambda t: t[3].__setitem__(2, 2)),
        ("positions", lambda t: t[4].__setitem__(1, 7)),  # sequence 0 holds 4 + 3 = 7 tokens
        ("positions", lambda t: t[4].__setitem__(0, -1)),
    ],
)
def test_check_page_table_names_the_bad_argument(name, spoil):
    table = _table("cpu")
    spoil(table)
    with pytest.raises(ValueError, match=f"^{name}:"):
        fp8_kv.check_page_table(*table, num_pages=5, page_size=4)


@pytest.mark.parametrize("backend", BACKENDS)
def test_pages_without_entries_store_nothing_and_q_is_written(backend):
    """A cache of page size 0 holds no entry: the paged op still writes q's outputs and stores
    nothing (the kernels never divide by the page size)."""
    dev = "cuda" if backend == "cuda" else "cpu"
    ctx = sgljit.use_backend("sycl") if backend == "sycl" else contextlib.nullcontext()
    T, Hq, Hk, R = 3, 4, 2, 32
    q, k = torch.randn(T, Hq, R, device=dev), torch.randn(T, Hk, R, device=dev)
    none_q, none_k = q[..., :0], k[..., :0]
    angles = torch.rand(8, R // 2, device=dev)
    table = torch.cat((angles.cos(), angles.sin()), -1)
    e4m3 = torch.float8_e4m3fn
    q_out, q_nope_out = torch.empty(T, Hq, R, device=dev, dtype=e4m3), none_q.to(e4m3)
    cache = torch.empty(2, 0, Hk, R, device=dev, dtype=e4m3)
    index = torch.zeros(T, dtype=torch.int32, device=dev)
    indptr = torch.tensor([0, 2], dtype=torch.int32, device=dev)
    with ctx:
        fp8_kv._rope_quantize_fp8_append_paged(
            q, k, none_q, none_k, k, table, index.long(), q_out, q_nope_out, cache,
            cache[..., :0], cache, index[:2], indptr, index, index, 1.0, 1.0, 1.0, True,
        )  # fmt: skip
    rows = table[0]
    c, s = rows[: R // 2].double().cpu(), rows[R // 2 :].double().cpu()
    x = q.double().cpu()
    want = torch.cat(
        (x[..., : R // 2] * c - x[..., R // 2 :] * s, x[..., R // 2 :] * c + x[..., : R // 2] * s),
        -1,
    )
    got = q_out.cpu().double()
    assert (
        float(((got - want.clamp(-448, 448).to(e4m3).double()).abs() / (1 + want.abs())).max())
        <= 0.13
    )
