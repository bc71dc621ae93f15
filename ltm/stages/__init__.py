"""One module per DVC stage, named as the stage and its notebook are: `tokenize`, `train`,
`ablate`, `benchmark`, `report`. Each holds the function its notebook calls."""
