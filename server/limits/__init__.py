"""What the server bounds, so that one client's body, prompt or stored response cannot stall or fill the
server for the others: the body's size and nesting (`body.py`), a prompt's text against what the context
can hold (`text_bounds.py`), the queue in sequences (`admission.py`), and who may call the admin
endpoints and read a stored response (`access.py`)."""
