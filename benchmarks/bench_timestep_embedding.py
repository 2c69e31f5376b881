"""Benchmark of sgljit.ops.timestep_embedding (diffusers' get_timestep_embedding).

    python3 benchmarks/bench_timestep_embedding.py              # on a CUDA GPU
    python3 benchmarks/bench_timestep_embedding.py --dry-run    # wiring check on the CPU

Shapes: batch 1 … 65536 for dim 256 (SD3/Flux/Wan's timestep projection) and dim 1024, fp32 output
(the default), plus dim 256 with bf16 output. Timesteps are fp32 in [0, 1000); flip_sin_to_cos=True,
downscale_freq_shift=0 (the Flux/SD3 configuration). Providers: sgljit (destination passing), torch
eager and torch.compile of diffusers' function as written, and sglang's jit_kernel ("sglang-jit",
benchmarks/sglang_provider.py: it allocates an fp32 output per call, cast to bf16 for the bf16
series). No Liger kernel exists for this op.

Bytes per call: the timesteps read once and the embedding written once (the write dominates:
B=65536, dim=1024, fp32 is 268 MB, about 63 µs at 4290 GB/s).
"""

import math
import sys

import sglang_provider as sglang_jit
import torch
from harness import Case, Op, nbytes, run_family, standard_providers

BATCHES = (1, 16, 128, 1024, 8192, 65536)
FLIP = True
SHIFT = 0.0


def make_case(batch: int, dim: int, dtype: torch.dtype) -> Case:
    def make_inputs(device):
        t = torch.rand(batch, device=device) * 1000
        return {"t": t, "dim": dim, "out": torch.empty(batch, dim, dtype=dtype, device=device)}

    return Case(
        label=f"B={batch}",
        tokens=batch,
        make_inputs=make_inputs,
        bytes=lambda i: nbytes(i["t"], i["out"]),
        series=f"dim={dim} {str(dtype).removeprefix('torch.')}",
    )


def load_sgljit():
    import sgljit

    f = sgljit.ops.timestep_embedding
    return lambda i: f(
        i["t"], i["dim"], flip_sin_to_cos=FLIP, downscale_freq_shift=SHIFT, out=i["out"]
    )


def torch_timestep_embedding(i):
    """diffusers.models.embeddings.get_timestep_embedding as written (fp32), cast to out's dtype."""
    timesteps, embedding_dim = i["t"], i["dim"]
    half_dim = embedding_dim // 2
    exponent = -math.log(10000) * torch.arange(
        start=0, end=half_dim, dtype=torch.float32, device=timesteps.device
    )
    exponent = exponent / (half_dim - SHIFT)
    emb = torch.exp(exponent)
    emb = timesteps[:, None].float() * emb[None, :]
    emb = torch.cat([torch.sin(emb), torch.cos(emb)], dim=-1)
    if FLIP:
        emb = torch.cat([emb[:, half_dim:], emb[:, :half_dim]], dim=-1)
    if embedding_dim % 2 == 1:
        emb = torch.nn.functional.pad(emb, (0, 1, 0, 0))
    return emb.to(i["out"].dtype)


def ops() -> list[Op]:
    cases = [make_case(b, 256, torch.float32) for b in BATCHES]
    cases += [make_case(b, 1024, torch.float32) for b in BATCHES]
    cases += [make_case(b, 256, torch.bfloat16) for b in BATCHES]
    return [
        Op(
            "timestep_embedding",
            cases,
            [
                *standard_providers(load_sgljit, torch_timestep_embedding),
                sglang_jit.provider(lambda: sglang_jit.load_timestep_embedding(FLIP, SHIFT)),
            ],
        )
    ]


if __name__ == "__main__":
    sys.exit(run_family("timestep_embedding", ops()))
