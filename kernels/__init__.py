"""Triton kernels, imported as `ltm.kernels`."""
