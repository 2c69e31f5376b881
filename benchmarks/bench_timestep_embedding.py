"""Benchmark of sgljit.ops.timestep_embedding (diffusers' get_timestep_embedding).

    python3 benchmarks/bench_timestep_embedding.py                  # on a CUDA GPU
    python3 benchmarks/bench_timestep_embedding.py --grid models    # diffusion models' widths
    python3 benchmarks/bench_timestep_embedding.py --dry-run        # wiring check on the CPU

Shapes, --grid default: batch 1 … 65536 for dim 256 (SD3/Flux/Wan's timestep projection) and dim
1024, fp32 output (the default), plus dim 256 with bf16 output. --grid models: the sinusoid widths of
diffusion models (MODEL_DIMS, named there) in fp32, and dim 256 in bf16, at batch sizes 1 … 4096
(MODEL_BATCHES: classifier-free guidance batches up to per-token timesteps of short sequences);
--grid quick: a few of them (QUICK_*), for A/B runs. Timesteps are fp32 in [0, 1000);
flip_sin_to_cos=True, downscale_freq_shift=0 (the Flux/SD3 configuration). Providers: sgljit
(destination passing), torch eager and torch.compile of diffusers' function as written, and
sglang's jit_kernel ("sglang-jit", benchmarks/sglang_provider.py: it allocates an fp32 output per
call, cast to bf16 for the bf16 series). No Liger kernel exists for this op.

Bytes per call: the timesteps read once and the embedding written once (the write dominates:
B=65536, dim=1024, fp32 is 268 MB, about 63 µs at 4290 GB/s).
"""

import math
import sys

import sglang_provider as sglang_jit
import torch
from harness import Case, Op, model_tokens, nbytes, run_family, standard_providers

BATCHES = (1, 16, 128, 1024, 8192, 65536)
FLIP = True
SHIFT = 0.0
# --grid models: the width of the sinusoidal timestep projection (diffusers' Timesteps(num_channels))
# of real models: 256 (DiT, PixArt, Sana, SD3, Flux (also its guidance embedding), Wan,
# HunyuanVideo, LTX-Video; SDXL's micro-conditioning, 6 values a sample), 320 (SD 1.x/2.x, SDXL
# and SVD UNets: block_out_channels[0]), 1920 (CogVideoX-2B: 30 heads x 64), 2048 (Kandinsky 2.x
# prior: 32 heads x 64), 3072 (CogVideoX-5B: 48 heads x 64).
MODEL_DIMS = (256, 320, 1920, 2048, 3072)
MODEL_BATCHES = (1, 2, 4, 8, 16, 64, 256, 1024, 4096)
QUICK_DIMS = (256, 3072)
QUICK_BATCHES = (1, 16, 4096)


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


def timestep_embedding_floor(i):
    """out.zero_(): the embedding written, one kernel (the timesteps, 4 bytes a row, left out)."""
    i["out"].zero_()


def ops(grid: str = "default") -> list[Op]:
    if grid == "default":
        cases = [make_case(b, 256, torch.float32) for b in BATCHES]
        cases += [make_case(b, 1024, torch.float32) for b in BATCHES]
        cases += [make_case(b, 256, torch.bfloat16) for b in BATCHES]
    else:
        quick = grid == "quick"
        dims, batches = (QUICK_DIMS, QUICK_BATCHES) if quick else (MODEL_DIMS, MODEL_BATCHES)
        batches = model_tokens(grid, batches)
        cases = [make_case(b, d, torch.float32) for d in dims for b in batches]
        cases += [make_case(b, 256, torch.bfloat16) for b in batches]
    return [
        Op(
            "timestep_embedding",
            cases,
            [
                *standard_providers(load_sgljit, torch_timestep_embedding),
                sglang_jit.provider(lambda: sglang_jit.load_timestep_embedding(FLIP, SHIFT)),
            ],
            floor=timestep_embedding_floor,
        )
    ]


if __name__ == "__main__":
    sys.exit(run_family("timestep_embedding", ops))
