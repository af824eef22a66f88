"""REST (retrieval-based speculative decoding, arXiv 2311.08252): drafts looked up in a datastore of text.

The datastore is a corpus tokenized once by ``specexec build-datastore`` (`datastore.py`). At start-up
each of its documents becomes a sequence of a `SuffixIndex`, and each step the request's context is
matched against it as suffix decoding matches (longest suffix, the most frequent continuation, a draft as
long as the match earns); REST's own lookup is a suffix array over the same text. The index is built
once and never changes: the requests' own text is suffix decoding's (``decoding_type: Suffix``).
"""

from __future__ import annotations

import logging
import time

from ..datastore import load_datastore
from ..retrieval_drafter import RetrievalDrafter
from ..suffix_index import Speculation, SuffixIndex
from .options import RestOptions

#: the loader's lines, which the command line shows without -v: a large datastore takes seconds to index
loading_logger = logging.getLogger("specexec.loading")


class RestDrafter(RetrievalDrafter):
    """Drafts from a datastore built by ``specexec build-datastore``; see the module docstring."""

    def __init__(
        self, max_draft_len: int, options: RestOptions, tokenizer=None, vocab_size: int | None = None
    ) -> None:
        super().__init__(max_draft_len, options.limits())
        self.options = options
        started = time.perf_counter()
        store = load_datastore(options.datastore, tokenizer, vocab_size)
        loading_logger.info("indexing REST datastore %s (%d tokens)", options.datastore, len(store.tokens))
        self.index = SuffixIndex()
        for document in store.documents():
            self.index.add(document)
        loading_logger.info(
            "REST datastore %s: %d documents, %d tokens, indexed in %.1f s",
            options.datastore,
            store.num_documents,
            len(store.tokens),
            time.perf_counter() - started,
        )

    def speculations(self, request, num_slots: int) -> list[Speculation]:
        return [self.index.speculate(request.token_ids, num_slots, self.limits)]
