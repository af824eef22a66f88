"""The kernel plan: every choice of which kernel runs what on this machine (`plan.py`), one choice per
module, each measured through one store (`measurement/`)."""
