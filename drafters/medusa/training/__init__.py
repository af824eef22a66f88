"""`specexec train-medusa`: the corpus EAGLE-3 trains on too, with the target's final hidden state
(`train`), and the rows and labels each head learns (`data`). Imports the executor (to prefill and
answer) and the training code it shares with EAGLE-3 (`drafters/training/`)."""
