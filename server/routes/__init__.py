"""The app's routes, one module per group, each with one ``add_*_routes(app, state)`` that registers its
routes on the app; what they share is one `ServerState` (`state.py`):

- `service.py`: ``/health``, ``/metrics``, ``/v1/models``;
- `workers.py`: the endpoints routers call (``/tokenize``, ``/get_server_info``, ``/flush_cache``, ...);
- `completions.py`: ``/v1/chat/completions`` and ``/v1/completions`` (streamed: `completion_stream.py`);
- `openai_responses.py`: the Responses API, ``/v1/responses``;
- `submit.py`: one request on the executor, for the routes that generate; `errors.py`: the error bodies.
"""
