"""ltm.train.counterpart: checkpoints of counterparts a configuration does not train are removed."""
from ltm.train.counterpart import LATENT, PLAIN, PLAIN_FLOPS, SUBFOLDERS, remove_stale_counterparts


def test_only_the_counterparts_this_run_does_not_train_are_removed(tmp_path):
    for folder in SUBFOLDERS.values():
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "last.pt").write_bytes(b"x")
    (tmp_path / "last.pt").write_bytes(b"main")
    said = []
    removed = remove_stale_counterparts(tmp_path, {PLAIN, PLAIN_FLOPS}, said.append)
    assert removed == [tmp_path / SUBFOLDERS[LATENT]]
    assert (tmp_path / SUBFOLDERS[PLAIN] / "last.pt").is_file()
    assert (tmp_path / SUBFOLDERS[PLAIN_FLOPS] / "last.pt").is_file()
    assert (tmp_path / "last.pt").read_bytes() == b"main"
    assert len(said) == 1 and SUBFOLDERS[LATENT] in said[0]
    # nothing stale: nothing said
    assert remove_stale_counterparts(tmp_path, {PLAIN, PLAIN_FLOPS}, said.append) == []
    assert len(said) == 1


def test_without_counterparts_every_counterpart_folder_goes(tmp_path):
    for folder in SUBFOLDERS.values():
        (tmp_path / folder).mkdir()
    remove_stale_counterparts(tmp_path, set(), lambda *_: None)
    assert not any((tmp_path / folder).exists() for folder in SUBFOLDERS.values())
