"""Causal SDPA forward+backward under each backend torch offers, at the GPU profile's shapes.

    python3 gpu/sdpa_backends.py

Times (triton.testing.do_bench median, bf16) F.scaled_dot_product_attention restricted to one
backend at a time, to see whether the train stage should ask for another than torch's default.
"""
import torch
import torch.nn.functional as F
import triton
import triton.testing
from torch.nn.attention import SDPBackend, sdpa_kernel

# (B, H, T, D): the GPU profile at T = 1024, 2048 and 8192
SHAPES = [(32, 12, 1024, 64), (8, 12, 2048, 64), (2, 12, 8192, 64)]
BACKENDS = [SDPBackend.FLASH_ATTENTION, SDPBackend.CUDNN_ATTENTION, SDPBackend.EFFICIENT_ATTENTION]


def fwd_bwd_ms(q, k, v, backend) -> float:
    do = torch.randn_like(q)

    def once():
        with sdpa_kernel([backend]):
            F.scaled_dot_product_attention(q, k, v, is_causal=True).backward(do)
    once()
    return triton.testing.do_bench(once, warmup=25, rep=100, grad_to_none=[q, k, v])


def main() -> None:
    print(torch.cuda.get_device_name(0), "torch", torch.__version__, "triton", triton.__version__)
    for B, H, T, D in SHAPES:
        q, k, v = (torch.randn(B, H, T, D, device="cuda", dtype=torch.bfloat16, requires_grad=True)
                   for _ in range(3))
        # causal attention FLOPs of forward + backward (2.5x the forward's 2 B H T^2 D)
        flops = 3.5 * 2 * B * H * T * T * D
        for backend in BACKENDS:
            try:
                ms = fwd_bwd_ms(q, k, v, backend)
                print(f"B{B} H{H} T{T} D{D} {backend.name:20} {ms:7.3f} ms "
                      f"{flops / ms / 1e9:6.0f} TFLOP/s (causal)", flush=True)
            except RuntimeError as err:
                print(f"B{B} H{H} T{T} D{D} {backend.name:20} unavailable: {str(err)[:80]}", flush=True)


if __name__ == "__main__":
    main()
