"""The engine core: the step loop and its stages (schedule, draft, forward, masks, verify, free), the
scheduler and block manager, request state and outputs. Speculation's stages and policies are in
`speculation/`. Imports `model/`, `layers/`, `sampling/`, `grammar/` and the drafter base class; never
the front (`executor/*.py`)."""
