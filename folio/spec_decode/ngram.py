"""NgramProposer: prompt lookup. The request's last n tokens are searched for earlier in its
own tokens (prompt and output); the tokens that followed the latest earlier occurrence are the
drafts. n goes from prompt_lookup_max down to prompt_lookup_min, so the longest match wins.

`lookup_ngram` states the rule as one vectorised numpy scan of the whole sequence (O(length)
per call: ~0.3 ms at 4,000 tokens, per request and step). The proposer gets the same answer from
`NgramIndex`, kept per request and extended by the tokens each step adds: per n, a dict from
each n-gram to the position after its latest occurrence, so a lookup is one dict probe per n.
Its memory: ~130 bytes per token and n (a 4,000-token request with n = 2..4: 1.6 MB measured), kept
only while the request runs.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

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


class NgramIndex:
    """One request's tokens and, per n in n_min..n_max, n-gram -> the position right after its
    latest occurrence that is followed by a token (so never the current suffix itself)."""

    def __init__(self, n_min: int, n_max: int) -> None:
        self.tokens: list[int] = []
        self.ns = range(n_min, n_max + 1)
        self.index: dict[int, dict[tuple[int, ...], int]] = {n: {} for n in self.ns}

    def extend(self, new_tokens: Sequence[int]) -> None:
        """Append tokens; every window that now has a follower is indexed (later wins)."""
        before = len(self.tokens)
        self.tokens.extend(new_tokens)
        for n in self.ns:
            # A window starting at s has a follower iff s <= length - 1 - n: those up to
            # before - 1 - n are indexed already.
            first, last = max(0, before - n), len(self.tokens) - 1 - n
            if last < first:
                continue
            keys = zip(*(self.tokens[first + j : last + 1 + j] for j in range(n)))
            self.index[n].update(zip(keys, range(first + n, last + n + 1)))

    def lookup(self, k: int) -> list[int]:
        length = len(self.tokens)
        for n in reversed(self.ns):
            if n > length - 1:
                continue
            after = self.index[n].get(tuple(self.tokens[length - n :]))
            if after is not None:
                return self.tokens[after : after + k]
        return []


class NgramProposer(Proposer):
    def __init__(self, config: SpeculativeConfig) -> None:
        super().__init__(config.num_speculative_tokens)
        self.n_min = config.prompt_lookup_min
        self.n_max = config.prompt_lookup_max
        self.indices: dict[str, NgramIndex] = {}  # request id -> its index, while it runs

    def propose(self, batch: ProposalBatch) -> dict[int, list[int]]:
        drafts = {}
        for i in speculating(batch):
            sched = batch.scheduled[i]
            drafts[i] = self._index_for(sched.request_id, sched.request.all_token_ids, batch.emitted[i]).lookup(self.k)
        return drafts

    def _index_for(self, request_id: str, known: list[int], emitted: list[int]) -> NgramIndex:
        """The request's index brought up to known + emitted (the tokens this step emitted may
        not be in all_token_ids yet); rebuilt if the tokens are not an extension of it."""
        index = self.indices.get(request_id)
        total = len(known) + len(emitted)
        if index is None or len(index.tokens) > total or not _extends(index.tokens, known, emitted):
            index = self.indices[request_id] = NgramIndex(self.n_min, self.n_max)
        have = len(index.tokens)
        if have < len(known):
            index.extend(known[have:])
            have = len(known)
        index.extend(emitted[have - len(known) :])
        return index

    def forget(self, request_ids: Iterable[str]) -> None:
        for request_id in request_ids:
            self.indices.pop(request_id, None)


def _extends(indexed: list[int], known: list[int], emitted: list[int]) -> bool:
    """Whether known + emitted starts with the indexed tokens (checked at the last one: a
    request's tokens only grow, so a mismatch there means it is another sequence)."""
    n = len(indexed)
    if n == 0:
        return True
    last = known[n - 1] if n <= len(known) else emitted[n - 1 - len(known)]
    return last == indexed[-1]
