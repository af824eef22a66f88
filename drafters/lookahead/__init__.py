"""Lookahead decoding: a Jacobi window and an n-gram pool, no training."""
