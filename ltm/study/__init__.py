"""The latent study (params.yaml `study:`): do latent thoughts carry information, and does a gain
survive its controls? Small decoders with a narrow attention window, so that z is the only
channel beyond it, trained and scored on the Markov-chain testbed (exact likelihood known) and on
the configured corpus: ltm.study.run.
"""
