"""What `specexec train-eagle3` and `specexec train-medusa` share: the corpus of the target's own answers
(`corpus`) to the bundled prompts no benchmark draw can pick (`bundled_prompts`), kept in append-only
files (`jsonl`) and a token archive (`archive`, the default model's in `data/`); the draft vocabulary
(`draft_vocab`), the validation split (`validation_split`), the training precision (`precision`) and
the machine flags and device (`machine`). Imports the executor (to answer prompts) and `prompt_sets/`."""
