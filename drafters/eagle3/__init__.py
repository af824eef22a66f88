"""EAGLE-3 in one place: the drafter (`drafter.py`), the head and its checkpoint format (`head.py`), the
head's weight quantization, the shipped head for SmolLM2 (`heads/`) and the training pipeline
(`training/`, `specexec train-eagle3`)."""
