"""Only a name kept for `tests/drafters/test_eagle3_eval.py`, which imports `CorpusArchive` from here: the
token archive is `drafters/training/archive.py`, shared with Medusa's training. Goes once that test
imports it from there."""

from ...training.archive import CorpusArchive  # noqa: F401
