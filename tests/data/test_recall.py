"""ltm.data.recall: the recall task is deterministic, every answer is the value written with its
key, the distances are what they say, and they reach beyond a window."""
import pytest
import torch

from ltm.data.recall import RecallTask, recall_batch
from ltm.model.cross_entropy import IGNORE_INDEX

TASK = RecallTask(seq_len=64, n_pairs=6, n_keys=10, n_values=8, n_filler=3)


def test_the_same_seed_gives_the_same_batch_and_another_seed_another():
    a, b, c = recall_batch(TASK, 16, seed=3), recall_batch(TASK, 16, seed=3), recall_batch(TASK, 16, seed=4)
    for name in ("tokens", "targets", "mask", "distance"):
        assert torch.equal(getattr(a, name), getattr(b, name))
    assert not torch.equal(a.tokens, c.tokens)


def test_every_answer_is_the_value_written_with_its_key_at_the_stated_distance():
    batch = recall_batch(TASK, 32, seed=0)
    keys = range(TASK.n_filler, TASK.n_filler + TASK.n_keys)
    assert batch.tokens.shape == (32, 64) and batch.tokens.dtype == torch.int64
    assert int(batch.tokens.max()) < TASK.vocab_size and int(batch.tokens.min()) >= 0
    assert torch.equal(batch.mask, batch.targets != IGNORE_INDEX)
    assert torch.equal(batch.mask, batch.distance >= 0)
    for seq, target, dist in zip(batch.tokens.tolist(), batch.targets.tolist(), batch.distance.tolist()):
        scored = [t for t in range(64) if target[t] != IGNORE_INDEX]
        assert len(scored) == TASK.n_pairs
        # each key appears exactly twice (written, then queried), always at an even position
        key_positions = [t for t in range(64) if seq[t] in keys]
        assert len(key_positions) == 2 * TASK.n_pairs and all(t % 2 == 0 for t in key_positions)
        for t in scored:
            first = seq.index(seq[t])  # the write: the key's first occurrence
            assert seq[t] in keys and first < t
            assert target[t] == seq[first + 1] == seq[t + 1]  # its value, also the next token
            assert dist[t] == t - first


def test_distances_span_the_sequence_and_beyond_a_window():
    task = RecallTask(seq_len=128, n_pairs=8)
    distance = recall_batch(task, 64, seed=1).distance
    scored = distance[distance >= 0]
    assert int(scored.min()) <= 8 and int(scored.max()) >= 96
    window = 16
    # placements are uniform over the slots: within the window, 1-2x and 2-4x and beyond all occur
    for low, high in ((0, window), (window, 2 * window), (2 * window, 4 * window), (4 * window, 128)):
        assert ((scored > low) & (scored <= high)).sum() >= 20


@pytest.mark.parametrize("settings, n, window, message", [
    ({"seq_len": 63}, 4, None, "seq_len: must be even"),
    ({"n_pairs": 0}, 4, None, "n_pairs: must be >= 1"),
    ({"seq_len": 16, "n_pairs": 5}, 4, None, "n_pairs: 5 pairs"),
    ({"n_keys": 3}, 4, None, "n_keys: must be >= n_pairs"),
    ({"n_values": 1}, 4, None, "n_values must be >= 2"),
    ({}, 0, None, "n: must be >= 1"),
    ({}, 4, 62, "window: must be in 1 .. seq_len - 3"),
])
def test_bad_settings_are_one_line_errors(settings, n, window, message):
    task = RecallTask(**{**TASK.__dict__, **settings})
    with pytest.raises(ValueError, match=message) as err:
        task.check(window)
        recall_batch(task, n, seed=0)
    assert "\n" not in str(err.value)
