"""The drafters that look their drafts up in text: suffix decoding over each request's text and earlier
outputs (`suffix.py`), REST over a datastore (`rest.py`, `datastore.py`, ``specexec build-datastore``),
both through one index (`suffix_index.py`)."""
