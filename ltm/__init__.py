"""ltm: latent-thought language models, their token mixers and fast kernels."""

__version__ = "0.1.0"
