"""REST: drafts looked up in a datastore of text (`drafter.py`; the datastore: `../datastore.py`)."""

from .drafter import RestDrafter
from .options import RestOptions

__all__ = ["RestDrafter", "RestOptions"]
