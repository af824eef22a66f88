"""Speculation inside the engine: the drafting stage (draft slots, the drafter's call through its guard,
the draft length per request and per step) and the speculative config. Imports the engine's request and
scheduler types, `model/`, `layers/` and `drafters.base`; never the front."""
