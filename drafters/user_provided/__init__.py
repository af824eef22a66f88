"""UserProvided: a `Drafter` subclass named by import path in the config (`options.py`), built with
the keyword arguments the config gives it."""
