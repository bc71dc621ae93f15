"""Reading results: the HTML page (`page`, with its GPU sections in `gpu`), its figures (`figures`),
this run against the last commit (`compare`), the curated GPU records (`records`) and
`dvc plots diff` drawn offline (`plots`)."""
