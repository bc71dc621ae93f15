"""The delta rule's launch lists (`ltm.kernels.delta_rule.launch_choices`) and its segments and
warm-ups (`segment_choices`): the rules they keep, whatever the measurements put first. Each listed
launch is checked against the token loop in test_kernels_delta_rule.py (on a GPU: every one; in the
interpreter: each value-block layout)."""
import triton

from ltm.kernels.delta_rule import launch_choices as choices
from ltm.kernels.delta_rule import segment_choices as seg_choices


def test_sequential_kernels_take_narrow_value_blocks_where_programs_are_few():
    few = choices._shape_class(1, 32768, 4, 128, 128, "bf16", None)  # 16 programs of 32 columns
    many = choices._shape_class(8, 2048, 8, 128, 128, "bf16", None)  # 256
    assert choices._sequential_configs(few)[0].kwargs["BV"] == 16
    assert choices._sequential_configs(many)[0].kwargs["BV"] == 32
    # float32 tiles keep their measured default everywhere
    assert choices._sequential_configs(choices._shape_class(1, 32768, 4, 64, 64, "tf32x3", None))[0].kwargs["BV"] == 32


def test_loop_kernels_keep_to_4_warps_where_one_value_block_covers_the_head():
    for K in (64, 128):
        for V in (16, 32):
            cls = choices._shape_class(1, 70, 2, K, V, "bf16", None)
            for configs in (choices._bwd_local_configs(cls), choices._bwd_chunk_configs(cls)):
                assert configs and all(c.num_warps == 4 for c in configs)
    wide = choices._shape_class(8, 2048, 8, 128, 128, "bf16", None)
    assert all(c.num_warps == 4 for c in choices._bwd_local_configs(wide))
    # 8 warps only where they loop over two value blocks or more
    for c in choices._bwd_chunk_configs(wide):
        assert c.num_warps == 4 or triton.cdiv(128, c.kwargs["BV"]) >= 2
    assert choices._bwd_chunk_configs(wide)[0].num_warps == 8


def test_segments_only_where_programs_leave_sms_idle(monkeypatch):
    few = choices._shape_class(1, 8192, 4, 128, 128, "bf16", None)  # 16 programs of 32 columns
    many = choices._shape_class(8, 2048, 8, 128, 128, "bf16", None)  # 256
    assert seg_choices._segment_chunks(few, 128) == 128  # off by default
    monkeypatch.setattr(seg_choices, "SEGMENTED_BACKWARD", True)
    assert seg_choices._segment_chunks(few, 128) == 128  # the forward's own switch
    assert (seg_choices.MIN_SEGMENT_CHUNKS <= seg_choices._segment_chunks(few, 128, backward=True)
            < 128)
    monkeypatch.setattr(seg_choices, "SEGMENTED_FORWARD", True)
    assert seg_choices._segment_chunks(many, 32) == 32
    seg = seg_choices._segment_chunks(few, 128)
    assert seg_choices.MIN_SEGMENT_CHUNKS <= seg < 128
    # segments bring the programs to at most about twice the SMs
    assert 16 * triton.cdiv(128, seg) <= 2 * choices.DEFAULT_SM_COUNT + 16
    short = 2 * seg_choices.MIN_SEGMENT_CHUNKS - 1
    assert seg_choices._segment_chunks(few, short) == short


def test_warmups_only_where_programs_leave_sms_idle(monkeypatch):
    few = choices._shape_class(1, 8192, 4, 128, 128, "bf16", None)  # 8 programs of 64 columns
    many = choices._shape_class(16, 2048, 16, 128, 128, "bf16", None)  # 512
    sms = choices.DEFAULT_SM_COUNT
    monkeypatch.setattr(seg_choices, "WARMUP_FORWARD", True)
    # (the segments counted in 64-wide programs)
    monkeypatch.setattr(seg_choices, "WARMUP_WIDE", True)
    assert seg_choices._warmup_chunks(many, 32) == 32
    seg = seg_choices._warmup_chunks(few, 128)
    assert seg_choices.MIN_WARMUP_CHUNKS <= seg < 128
    assert 8 * triton.cdiv(128, seg) <= seg_choices.WARMUP_FILL * sms + 8
    # a call's own choice and sizes, and too short a sequence to split
    assert seg_choices._warmup_chunks(few, 128, False) == 128
    assert seg_choices._warmup_chunks(few, 128, True, 64, 8) == 64
    short = 2 * seg_choices.MIN_WARMUP_CHUNKS - 1
    assert seg_choices._warmup_chunks(few, short) == short
    # programs a little over the SMs still split where the fill asks for two segments or more:
    # B H 36 is the class of 64, 128 programs of 64 columns (the backward's; the forward's stay
    # on the one-segment pass's 32 columns there, 256 programs)
    over = choices._shape_class(3, 5000, 12, 128, 128, "bf16", None)
    for fill in (8, 2):
        wanted = triton.cdiv(79, fill * sms // 128)
        assert seg_choices._warmup_chunks(over, 79, True, 4, fill, backward=True) == wanted
    assert seg_choices._warmup_chunks(over, 79, True, 4, 8) == triton.cdiv(79, 8 * sms // 256)
    assert seg_choices._warmup_chunks(over, 79, True, 4, 1, backward=True) == 79
    assert seg_choices._warmup_chunks(few, 128, True, 0, 2) == 128  # min_chunks 0: off
    # 32-wide programs without WARMUP_WIDE: twice as many, half the segments
    monkeypatch.setattr(seg_choices, "WARMUP_WIDE", False)
    assert seg_choices._warmup_chunks(over, 79, True, 4, 2, backward=True) == 79
    monkeypatch.setattr(seg_choices, "WARMUP_WIDE", True)
    monkeypatch.setattr(seg_choices, "WARMUP_FORWARD", False)
    assert seg_choices._warmup_chunks(few, 128) == 128
    assert seg_choices._warmup_chunks(few, 128, True) == seg
    # floors for every tile precision, below each one's rounding
    assert set(seg_choices.WARMUP_LOG_FLOOR) == {"bf16", "tf32", "tf32x3", "ieee"}
    floor = seg_choices.WARMUP_LOG_FLOOR
    assert floor["ieee"] <= -16 and floor["bf16"] <= -8


def test_the_default_rule_fuses_where_programs_are_many(monkeypatch):
    # without forcing: a forward without a backward at many programs (bf16) takes the fused pass,
    # one at few programs or with a backward does not (launch_choices' rule, on a CPU's assumed
    # SM count under the interpreter)
    cls = choices._shape_class
    many, few = cls(8, 2048, 8, 128, 128, "bf16", None), cls(2, 8192, 8, 128, 128, "bf16", None)
    assert choices._fuses_output(many, backward=False)
    assert not choices._fuses_output(many, backward=True)
    assert not choices._fuses_output(few, backward=False)
    assert not choices._fuses_output(cls(8, 2048, 8, 128, 128, "ieee", None), backward=False)
    monkeypatch.setitem(choices.FUSED_OUTPUT, "inference", False)
    assert not choices._fuses_output(many, backward=False)



def test_state_pass_and_outputs_overlap_only_between_64_and_128_programs(monkeypatch):
    cls = choices._shape_class
    mid = cls(2, 8192, 8, 128, 128, "bf16", None)  # 64 programs of 32 columns
    assert seg_choices._overlaps_output(mid, 128, backward=True)
    assert seg_choices._overlaps_output(mid, 128, backward=False)
    # 16: the pass is the forward; 128: measured slower; 256: no SM idle
    assert not seg_choices._overlaps_output(cls(1, 32768, 4, 128, 128, "bf16", None), 512)
    assert not seg_choices._overlaps_output(cls(4, 2048, 8, 128, 128, "bf16", None), 32)
    assert not seg_choices._overlaps_output(cls(8, 2048, 8, 128, 128, "bf16", None), 32)
    assert not seg_choices._overlaps_output(mid, 1)  # one chunk: nothing to overlap
    configs = choices._overlapped_configs(mid)
    assert all(c.kwargs["LANES"] == 32 * c.num_warps for c in configs)
    assert configs[0].kwargs["BV"] == choices._sequential_configs(mid)[0].kwargs["BV"]
    monkeypatch.setitem(choices.OVERLAPPED_OUTPUT, "training", False)
    assert not seg_choices._overlaps_output(mid, 128, backward=True)
    assert seg_choices._overlaps_output(mid, 128, backward=False)


def test_prep_loops_over_chunks_with_bf16_tiles_only(monkeypatch):
    bf16 = choices._shape_class(2, 8192, 8, 128, 128, "bf16", None)
    assert choices._prep_persistent(bf16)
    assert choices._prep_configs(bf16)[0].num_stages == 2  # the next chunk's loads while this one works
    f32 = choices._shape_class(2, 8192, 8, 128, 128, "tf32x3", None)
    assert not choices._prep_persistent(f32)
    assert choices._prep_configs(f32)[0].num_stages == 1
    monkeypatch.setattr(choices, "PREP_PROGRAMS_PER_SM", 0)
    assert not choices._prep_persistent(bf16)
    # the list is cached per class, yet follows the switch: one program per chunk, 1 stage at K = 128
    assert choices._prep_configs(bf16)[0].num_stages == 1


def test_warmup_launches_take_64_wide_value_blocks_first_where_bf16_tiles_allow(monkeypatch):
    # the wide block first, once, before the state pass's own list; other tiles and narrow heads
    # keep that list as it is
    monkeypatch.setattr(seg_choices, "WARMUP_WIDE", True)
    wide = choices._shape_class(1, 8192, 4, 128, 128, "bf16", None)
    configs = seg_choices._warmup_configs(wide)
    assert configs[0].kwargs["BV"] == 64 and (configs[0].num_warps, configs[0].num_stages) == (4, 3)
    assert len({str(c) for c in configs}) == len(configs)
    assert {str(c) for c in configs[1:]} <= {str(c) for c in choices._sequential_configs(wide)}
    for other in (choices._shape_class(1, 8192, 4, 128, 128, "tf32x3", None),
                  choices._shape_class(1, 8192, 4, 64, 32, "bf16", None)):
        assert [str(c) for c in seg_choices._warmup_configs(other)] == [
            str(c) for c in choices._sequential_configs(other)]
    monkeypatch.setattr(seg_choices, "WARMUP_WIDE", False)
    assert [str(c) for c in seg_choices._warmup_configs(wide)] == [
        str(c) for c in choices._sequential_configs(wide)]


def test_the_forwards_warmups_go_wide_only_where_its_narrow_programs_leave_sms_idle(monkeypatch):
    monkeypatch.setattr(seg_choices, "WARMUP_WIDE", True)
    monkeypatch.setattr(seg_choices, "WARMUP_WIDE_FORWARD_ALWAYS", False)
    few = choices._shape_class(1, 32768, 8, 128, 128, "bf16", None)  # 64 programs of 16 columns
    filled = choices._shape_class(8, 2048, 8, 128, 128, "bf16", None)  # 256 of 32 columns
    sms = choices.DEFAULT_SM_COUNT
    assert 64 < sms <= 256
    for backward in (False, True):
        assert seg_choices._warmup_configs(few, backward)[0].kwargs["BV"] == 64
        assert seg_choices._warmup_splits_heads(few, backward)
    # the backward's wide where the forward keeps the one-segment pass's list (and its segments:
    # 256 narrow programs fill the SMs twice over at fill 1, so no split)
    assert seg_choices._warmup_configs(filled, True)[0].kwargs["BV"] == 64
    assert seg_choices._warmup_splits_heads(filled, True)
    assert not seg_choices._warmup_splits_heads(filled)
    assert [str(c) for c in seg_choices._warmup_configs(filled)] == [
        str(c) for c in choices._sequential_configs(filled)]
    assert seg_choices._warmup_chunks(filled, 32, True, 4, 1) == 32
    assert seg_choices._warmup_chunks(filled, 32, True, 4, 1, backward=True) == 32
    assert seg_choices._warmup_chunks(filled, 32, True, 4, 2, backward=True) == 16
    assert seg_choices._warmup_chunks(filled, 32, True, 4, 2) == 32
    monkeypatch.setattr(seg_choices, "WARMUP_WIDE_FORWARD_ALWAYS", True)
    assert seg_choices._warmup_configs(filled)[0].kwargs["BV"] == 64
    assert seg_choices._warmup_chunks(filled, 32, True, 4, 2) == 16


def test_by_default_warmups_only_where_the_one_segment_pass_leaves_sms_idle(monkeypatch):
    # 3,5000,12,128 and 8,2048,8,128: 144 and 256 programs of 32 columns fill the SMs, so neither
    # pass warms up by default (a call's warmup=True or WARMUP_WHERE_FILLED still splits them);
    # 1,32768,8,128 (64 programs of 16 columns) and 2,8192,8,128 (64 of 32) still do
    monkeypatch.setattr(seg_choices, "WARMUP_FORWARD", True)
    monkeypatch.setattr(seg_choices, "WARMUP_BACKWARD", True)
    monkeypatch.setattr(seg_choices, "WARMUP_WHERE_FILLED", False)
    sms = choices.DEFAULT_SM_COUNT
    filled = [choices._shape_class(3, 5000, 12, 128, 128, "bf16", None),
              choices._shape_class(8, 2048, 8, 128, 128, "bf16", None)]
    idle = [choices._shape_class(1, 32768, 8, 128, 128, "bf16", None),
            choices._shape_class(2, 8192, 8, 128, 128, "bf16", None)]
    for cls in filled:
        assert seg_choices._one_segment_programs(cls) >= sms
        for backward in (False, True):
            assert seg_choices._warmup_chunks(cls, 32, backward=backward) == 32
        assert seg_choices._warmup_chunks(cls, 32, True, backward=True) < 32
    for cls in idle:
        assert seg_choices._one_segment_programs(cls) < sms
        for backward in (False, True):
            assert seg_choices._warmup_chunks(cls, 128, backward=backward) < 128
    monkeypatch.setattr(seg_choices, "WARMUP_WHERE_FILLED", True)
    assert seg_choices._warmup_chunks(filled[1], 32, backward=True) < 32
