"""The train/val split by work: documents grouped by the work they hold, so that every edition
of a work lands on one side (`split_documents`).

The default corpus ships many plays twice (a modern Gutenberg text `lear_gut.txt` and the First
Folio `lear_gut_f.txt`), under titles that differ in spelling (`twelfth_night` / `twelfe-night`,
`antony_and_cleopatra` / `anthonie_and_cleopatra`); a split by document put the other edition of
6 of its 8 validation plays in train, so every validation loss rewarded memorisation. Titles are
unreliable, so the grouping reads the texts: two documents are one work when a large share of the
smaller one's 5-word shingles also occurs in the other. On the default corpus editions of one play
share 0.23-0.32 of their shingles, texts that print the same poems (The Passionate Pilgrim and
Love's Labour's Lost; Milton's Poems and Comus) 0.11-0.68, and unrelated texts under 0.01.
"""
from __future__ import annotations

import hashlib
import re
import zlib
from collections import defaultdict
from itertools import combinations

from ltm.data.corpus import DataError, Document

SHINGLE_WORDS = 5
# one shingle in SAMPLE_EVERY is kept (chosen by its hash, the same in every text): the shared
# share is estimated from the sample, which keeps the pairwise counting cheap on large corpora
SAMPLE_EVERY = 8
# the least shared share that makes two documents one work (see the module docstring), and the
# least multiple of the corpus's median pair share: texts of a tiny vocabulary (random words in
# the tests) share most shingles by chance, and then no share is evidence of one work
SAME_WORK = 0.1
ABOVE_CHANCE = 5.0
# the median tells chance only over enough pairs (with two documents it is their own share)
CHANCE_PAIRS = 6
# a sampled shingle found in more documents than this is a stock phrase, not evidence of a work
STOCK_PHRASE_DOCS = 32


def sampled_shingles(text: str) -> set[int]:
    """The sampled 5-word shingles of a text (lower-cased letters only), as stable hashes."""
    words = re.findall(r"[a-z]+", text.lower())
    hashes = (zlib.crc32(" ".join(words[i:i + SHINGLE_WORDS]).encode())
              for i in range(len(words) - SHINGLE_WORDS + 1))
    return {h for h in hashes if h % SAMPLE_EVERY == 0}


def shared_share(a: set[int], b: set[int]) -> float:
    """The share of the smaller set's shingles that the other one holds too."""
    return len(a & b) / max(1, min(len(a), len(b)))


def median_pair_share(shares: list[float], n_docs: int) -> float:
    """The median share over all pairs of n_docs documents, `shares` those of the pairs with a
    common shingle (every other pair shares nothing); 0 below CHANCE_PAIRS pairs."""
    n_pairs = n_docs * (n_docs - 1) // 2
    if n_pairs < CHANCE_PAIRS:
        return 0.0
    ranked = [0.0] * (n_pairs - len(shares)) + sorted(shares)
    return ranked[n_pairs // 2]


def group_works(docs: list[Document]) -> list[list[Document]]:
    """The documents grouped by work (each group in the documents' order, groups ordered by their
    first document): one group per document unless texts share SAME_WORK of their shingles."""
    shingles = [sampled_shingles(d.text) for d in docs]
    postings: dict[int, list[int]] = defaultdict(list)
    for index, found in enumerate(shingles):
        for h in found:
            postings[h].append(index)
    candidates = {pair for holders in postings.values() if 1 < len(holders) <= STOCK_PHRASE_DOCS
                  for pair in combinations(holders, 2)}
    parent = list(range(len(docs)))

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    shares = {pair: shared_share(shingles[pair[0]], shingles[pair[1]]) for pair in sorted(candidates)}
    threshold = max(SAME_WORK, ABOVE_CHANCE * median_pair_share(list(shares.values()), len(docs)))
    for (i, j), share in shares.items():
        if share >= threshold:
            parent[root(j)] = root(i)
    groups: dict[int, list[Document]] = {}
    for index, doc in enumerate(docs):
        groups.setdefault(root(index), []).append(doc)
    return list(groups.values())


def split_documents(docs: list[Document], val_fraction: float, seed: int,
                    groups: list[list[Document]] | None = None
                    ) -> tuple[list[Document], list[Document]]:
    """Deterministic train/val split by work (`groups`, default `group_works(docs)`): the same
    names and seed give the same split, whatever order the documents came in. Works are drawn for
    val until it holds round(val_fraction * documents); at least one work lands on each side."""
    if len(docs) < 2:
        raise DataError(f"corpus has {len(docs)} document(s); a train/val split needs at least 2")
    groups = group_works(docs) if groups is None else groups
    if len(groups) < 2:
        raise DataError(f"the corpus's {len(docs)} documents are editions of one work (they share "
                        f"most of their text); a train/val split needs at least 2 works")
    ranked = sorted(groups, key=lambda g: hashlib.sha256(
        f"{seed}:{min(d.name for d in g)}".encode()).hexdigest())
    n_val = min(max(1, round(val_fraction * len(docs))), len(docs) - 1)
    val_names: set[str] = set()
    for group in ranked[:-1]:  # the last work stays in train
        if len(val_names) >= n_val:
            break
        val_names |= {d.name for d in group}
    return [d for d in docs if d.name not in val_names], [d for d in docs if d.name in val_names]
