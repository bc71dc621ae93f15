"""The delta rule's state passes (`ltm.kernels.delta_rule.state_passes`): by segments, forward
and backward, they compute what the one sequential pass computes, including the initial and
final states and their gradients (against float64 in test_kernels_delta_rule.py)."""
import torch
from reference import DEVICE, case_seed, rel_err
from test_kernels_delta_rule import make_inputs, spy_on_launches

from ltm.kernels.delta_rule import triton_chunk_delta_rule
from ltm.kernels.delta_rule.chunk import CHUNK


def run(xs, segments):
    """o, the final state and every gradient (one fixed output and state gradient) of one call."""
    leaves = [x.detach().clone().requires_grad_() if x is not None else None for x in xs]
    q, k, v, beta, g, h0 = leaves
    o, ht = triton_chunk_delta_rule(q, k, v, beta, g, initial_state=h0, output_final_state=True,
                                    segments=segments)
    gen = torch.Generator().manual_seed(1)
    do = torch.randn(o.shape, generator=gen).to(DEVICE)
    dht = torch.randn(ht.shape, generator=gen).to(DEVICE)
    torch.autograd.backward((o, ht), (do.to(o.dtype), dht))
    return [o, ht] + [x.grad for x in leaves if x is not None]


def test_segments_give_the_one_pass_results_forward_and_backward(monkeypatch):
    # 9 chunks (the last masked) in segments of 2: 5 segments, with an initial state and decay
    # (the gated passes' segments by warm-ups off: test_kernels_delta_rule.py checks those)
    from ltm.kernels.delta_rule import segment_choices
    monkeypatch.setattr(segment_choices, "WARMUP_FORWARD", False)
    monkeypatch.setattr(segment_choices, "WARMUP_BACKWARD", False)
    xs = make_inputs(1, 8 * CHUNK + 3, 2, 32, 48, "strong", True, torch.float32, case_seed())
    launched = spy_on_launches(monkeypatch)
    one_pass = run(xs, (0, 1))
    assert "delta_rule.bwd_segment_states" not in launched
    segmented = run(xs, (2, 8))
    assert {"delta_rule.fwd_segment_states", "delta_rule.bwd_segment_states"} <= set(launched)
    for name, a, b in zip(("o", "ht", "dq", "dk", "dv", "dbeta", "dg", "dh0"), one_pass, segmented):
        assert rel_err(b, a) <= 1e-5, name
