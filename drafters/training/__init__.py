"""What `specexec train-eagle3` and `specexec train-medusa` share: the draft vocabulary (`draft_vocab`)."""
