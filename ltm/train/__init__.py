"""Training: the settings of `train:` (`settings`), the loop (`trainer`), the model with its loss
(`objective`), optimisers and speed levers, checkpoints (written and read), the machine
(`hardware`), the counterpart models of the comparison (`counterpart`) and the prior's training
(`prior_trainer`)."""
