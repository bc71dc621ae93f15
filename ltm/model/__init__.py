"""The language model: its settings (`config`), the LTM stack (`lm`), the token mixers (`mixers`,
over the ops of `ltm.ops`), the one home of cross-entropy (`cross_entropy`) and generation from
static buffers (`decoding`)."""
