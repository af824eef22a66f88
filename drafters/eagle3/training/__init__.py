"""`specexec train-eagle3`: the prompts it adds to the bundled ones (a self-instruct pool, document
tasks), the head's features, training-time test, checkpoints, a start head reshaped, and the head saved
in the published layout. The corpus, its token archive, the draft vocabulary, the validation split,
the precision and the machine flags are shared with Medusa's training (`drafters/training/`). Imports
the executor (to answer prompts) and `prompt_sets/`."""
