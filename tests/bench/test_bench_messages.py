"""Messages from libraries during a benchmark run wait until the progress bar is done, then come once each."""

from __future__ import annotations

import logging
import warnings

from specexec.bench.held_messages import library_messages_after_the_bar
from transformers.utils import logging as hf_logging

DEPRECATION = "Passing `generation_config` together with generation-related arguments is deprecated"


def test_transformers_log_records_wait_for_the_bar_and_come_once(capsys):
    hf_logger = logging.getLogger("transformers")
    handlers_before = hf_logger.handlers[:]
    with library_messages_after_the_bar():
        for _ in range(3):  # one per assisted generate() call
            hf_logging.get_logger("transformers.generation.utils").warning(DEPRECATION)
        assert capsys.readouterr().err == "", "printed while the bar draws"
    assert capsys.readouterr().err == f"[transformers: {DEPRECATION}]\n"
    assert hf_logger.handlers == handlers_before


def test_python_warnings_wait_for_the_bar_and_come_once(capsys):
    with warnings.catch_warnings():
        warnings.simplefilter("always")  # pytest's filterwarnings=error would raise them instead
        with library_messages_after_the_bar():
            for _ in range(2):
                warnings.warn("torch.foo is deprecated", FutureWarning, stacklevel=1)
            assert capsys.readouterr().err == ""
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("[FutureWarning: torch.foo is deprecated (")


def test_messages_held_before_an_interrupt_are_still_printed(capsys):
    try:
        with library_messages_after_the_bar():
            hf_logging.get_logger("transformers").warning("held")
            raise KeyboardInterrupt
    except KeyboardInterrupt:
        pass
    assert capsys.readouterr().err == "[transformers: held]\n"
