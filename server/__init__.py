"""``specexec serve``: an OpenAI-compatible HTTP server over the async front (needs the ``serve`` extra:
FastAPI, uvicorn, prometheus-client)."""
