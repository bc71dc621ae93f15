"""Latent thoughts: per-sequence posteriors fitted by the inner loop (`posterior`), their honest
evaluation (`evaluate`) and a learned diffusion prior over them (`prior`)."""
