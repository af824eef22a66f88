"""`specexec train-eagle3`: the corpus (bundled prompts, a self-instruct pool, document tasks, the token
archive in `data/`), the draft vocabulary and features, training-time test, checkpoints, and the head
saved in the published layout. Imports the executor (to answer prompts) and `prompt_sets/`."""
