"""`specexec train-medusa`: EAGLE-3's corpus with the target's final hidden state (`train`), the rows and
labels each head learns (`data`). Imports the executor (to prefill and answer) and EAGLE-3's training."""
