"""What a request's fields do: one table of every field other engines' clients send and this server's
action for each (`field_table.py`), its checks (`fields.py`), and the fields that ask for an output
format mapped onto the engine's guided decoding (`guided_fields.py`)."""
