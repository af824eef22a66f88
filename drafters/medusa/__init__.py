"""Medusa: decoding heads on the target's last hidden state (`heads.py`), drafting chains or best-first
trees (`drafter.py`, `tree.py`), trained by `specexec train-medusa` (`training/`)."""
