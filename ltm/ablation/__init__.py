"""The ablate protocol: the switches and their verdicts (`protocol`), one measurement of a candidate
against its baseline (`measure`) and the runner that times a configuration from the trained
checkpoint and profiles where its step's time goes (`runner`)."""
