"""sgljit plugin: sinusoidal diffusion timestep embedding (diffusers' ``get_timestep_embedding``)."""

MANIFEST = {
    "name": "timestep_embedding",
    "version": "0.1.0",
    "requires_sgljit": ">=0.1,<0.2",
    "ops": {"timestep_embedding": "sgljit_timestep_embedding.ops:timestep_embedding"},
    "family": "sgljit_timestep_embedding.ops:family",
}
