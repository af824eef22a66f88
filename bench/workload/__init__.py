"""What one `specexec bench` run holds every engine to: its one stop set (`stop_tokens.py`) and its
interleaved repeats (`repeats.py`)."""
