"""NgramProposer: prompt lookup. The request's last n tokens are searched for earlier in its
own tokens (prompt and output); the tokens that followed the latest earlier occurrence are the
drafts. n goes from prompt_lookup_max down to prompt_lookup_min, so the longest match wins.

Host-only numpy work: a vectorised comparison of every window of length n with the suffix.
"""

from __future__ import annotations

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from folio.config.speculative import SpeculativeConfig
from folio.spec_decode.proposer import ProposalBatch, Proposer, speculating


def lookup_ngram(tokens: np.ndarray, n_min: int, n_max: int, k: int) -> list[int]:
    """Up to k tokens that followed the latest earlier occurrence of tokens' longest suffix of
    n_max ... n_min tokens; [] when no suffix recurs."""
    length = len(tokens)
    for n in range(min(n_max, length - 1), n_min - 1, -1):
        suffix = tokens[length - n :]
        # Windows starting at 0 ... length - 1 - n: each is followed by at least one token, and
        # the suffix itself (starting at length - n) is not among them.
        windows = sliding_window_view(tokens[: length - 1], n)  # [length - n, n]
        hits = np.flatnonzero((windows == suffix).all(axis=1))
        if len(hits):
            start = int(hits[-1]) + n
            return tokens[start : start + k].tolist()
    return []


class NgramProposer(Proposer):
    def __init__(self, config: SpeculativeConfig) -> None:
        super().__init__(config.num_speculative_tokens)
        self.n_min = config.prompt_lookup_min
        self.n_max = config.prompt_lookup_max

    def propose(self, batch: ProposalBatch) -> dict[int, list[int]]:
        drafts = {}
        for i in speculating(batch):
            request = batch.scheduled[i].request
            tokens = np.asarray(request.all_token_ids + batch.emitted[i], dtype=np.int64)
            drafts[i] = lookup_ngram(tokens, self.n_min, self.n_max, self.k)
        return drafts
