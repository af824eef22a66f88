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
from dataclasses import dataclass

from .datastore import load_datastore
from .retrieval_drafter import LookupConfig, RetrievalDrafter
from .suffix_index import Speculation, SuffixIndex

#: the loader's lines, which the command line shows without -v: a large datastore takes seconds to index
loading_logger = logging.getLogger("specexec.loading")

REST_SPEC_FACTOR = 1.0
REST_SPEC_OFFSET = 0.0


@dataclass(slots=True)
class RestConfig(LookupConfig):
    datastore: str = ""  #: the ``.npz`` file `specexec build-datastore` wrote for this target's tokenizer
    #: drafts per matched token, and drafts added to that (may be negative): 1 and 0, not Suffix's 2 and 1.
    #: A large corpus matches short suffixes anywhere; on HumanEval over Python's standard library the
    #: longer drafts doubled the drafts for the same accepted tokens
    #: (`bench/reports/2026-11-29-suffix-decoding/`)
    max_spec_factor: float = REST_SPEC_FACTOR
    max_spec_offset: float = REST_SPEC_OFFSET

    def __post_init__(self) -> None:
        if not isinstance(self.datastore, str) or not self.datastore:
            raise ValueError(
                f"REST needs option datastore: the .npz file `specexec build-datastore` wrote, got {self.datastore!r}"
            )
        LookupConfig.__post_init__(self)


class RestDrafter(RetrievalDrafter):
    """Drafts from a datastore built by ``specexec build-datastore``; see the module docstring."""

    def __init__(self, config: RestConfig, tokenizer=None, vocab_size: int | None = None) -> None:
        super().__init__(config.max_draft_len, config.limits())
        self.config = config
        started = time.perf_counter()
        store = load_datastore(config.datastore, tokenizer, vocab_size)
        loading_logger.info("indexing REST datastore %s (%d tokens)", config.datastore, len(store.tokens))
        self.index = SuffixIndex()
        for document in store.documents():
            self.index.add(document)
        loading_logger.info(
            "REST datastore %s: %d documents, %d tokens, indexed in %.1f s",
            config.datastore,
            store.num_documents,
            len(store.tokens),
            time.perf_counter() - started,
        )

    def speculations(self, request, num_slots: int) -> list[Speculation]:
        return [self.index.speculate(request.token_ids, num_slots, self.limits)]
