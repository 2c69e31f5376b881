"""FP8 quantization: per-tensor dynamic, per-tensor static, per-token (bf16 -> float8_e4m3fn).

    python3 benchmarks/bench_quant_fp8.py              # on a CUDA GPU
    python3 benchmarks/bench_quant_fp8.py --dry-run    # wiring check on the CPU

Providers: sgljit, torch eager and torch.compile of the same PyTorch formula
(``(x.float() / scale).clamp(-448, 448).to(float8_e4m3fn)``, scale ``max(absmax / 448, 2^-126)``),
and sglang's jit_kernel ("sglang-jit", benchmarks/sglang_provider.py): its dynamic per-tensor time
includes zeroing the scale buffer first (its absmax is an atomic max into it), its per-token time is
per-token-group quantization with one group per row.
Bytes: input read once, fp8 output and scale(s) written once. The dynamic per-tensor op must read
the input twice in general (absmax, then quantize); that second read is *not* counted, so its GB/s
is against one read (sgljit keeps up to ~29 MB of it on chip: shared memory + L2).
"""

import sys

import sglang_provider as sglang_jit
import torch
from harness import Case, Op, nbytes, run_family, standard_providers

TOKENS = (1, 16, 128, 1024, 2048, 4096, 8192, 16384, 65536)
HIDDEN = 4096
FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0
MIN_SCALE = 2.0**-126


def make_case(tokens: int, hidden: int, dtype: torch.dtype, kind: str) -> Case:
    def make_inputs(device):
        x = torch.randn(tokens, hidden, dtype=dtype, device=device)
        inputs = {"x": x, "out": torch.empty(tokens, hidden, dtype=FP8, device=device)}
        if kind == "static":
            inputs["scale"] = (x.abs().amax().float() / FP8_MAX).reshape(1)
        return inputs

    def nb(i):
        scales = 4 * (tokens if kind == "per_token" else 1)
        return nbytes(i["x"], i["out"]) + scales

    return Case(
        label=f"T={tokens}",
        tokens=tokens,
        make_inputs=make_inputs,
        bytes=nb,
        series=f"H={hidden} {str(dtype).removeprefix('torch.')} -> e4m3",
    )


def _div(a, b):
    return a / torch.full_like(a, b)


def torch_dynamic(i):
    x = i["x"]
    scale = _div(x.abs().amax().float().reshape(1), FP8_MAX).clamp_min(MIN_SCALE)
    return (x.float() / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8), scale


def torch_static(i):
    return (i["x"].float() / i["scale"]).clamp(-FP8_MAX, FP8_MAX).to(FP8)


def torch_per_token(i):
    x = i["x"]
    scales = _div(x.abs().amax(dim=-1, keepdim=True).float(), FP8_MAX).clamp_min(MIN_SCALE)
    return (x.float() / scales).clamp(-FP8_MAX, FP8_MAX).to(FP8), scales


def load_dynamic():
    import sgljit

    f = sgljit.ops.per_tensor_quant_fp8
    return lambda i: f(i["x"], out=i["out"])


def load_static():
    import sgljit

    f = sgljit.ops.per_tensor_quant_fp8
    return lambda i: f(i["x"], i["scale"], out=i["out"])


def load_per_token():
    import sgljit

    f = sgljit.ops.per_token_quant_fp8
    return lambda i: f(i["x"], out=i["out"])


def ops() -> list[Op]:
    def cases(kind):
        return [make_case(t, HIDDEN, torch.bfloat16, kind) for t in TOKENS]

    return [
        Op(
            "per_tensor_dynamic",
            cases("dynamic"),
            [
                *standard_providers(load_dynamic, torch_dynamic),
                sglang_jit.provider(
                    sglang_jit.load_per_tensor_quant_fp8_dynamic, sglang_jit.prepare_dynamic_scale
                ),
            ],
        ),
        Op(
            "per_tensor_static",
            cases("static"),
            [
                *standard_providers(load_static, torch_static),
                sglang_jit.provider(sglang_jit.load_per_tensor_quant_fp8_static),
            ],
        ),
        Op(
            "per_token",
            cases("per_token"),
            [
                *standard_providers(load_per_token, torch_per_token),
                sglang_jit.provider(
                    sglang_jit.load_per_token_quant_fp8, sglang_jit.prepare_per_token_scales
                ),
            ],
        ),
    ]


if __name__ == "__main__":
    sys.exit(run_family("quant_fp8", ops()))
