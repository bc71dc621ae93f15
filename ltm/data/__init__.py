"""Text in, tokens out: the corpus (`corpus`), the BPE tokenizer (`tokenizer`), the memmapped token
cache (`cache`) and the training batches drawn from it (`batches`)."""
