"""BlockHash: the identity of a full KV block's contents, chained from its parent block.

The K/V of a token depend on the token and on every token before it (through attention), so a
full block is identified by the hash of its parent block's hash and its own token ids. Two
requests whose first k blocks hash equal hold equal K/V in those blocks, whatever else differs.

Anything else that changes K/V must enter the chain too, as extra bytes of the first block: a
request's `cache_salt` (it isolates tenants: two salts never share a block) and its LoRA adapter
(an adapter changes every layer's K/V: the same prompt under two adapters, or under an adapter
and the base model, never shares a block). Multimodal inputs would join the same way.

SHA-256 (truncated to 128 bits) rather than Python's hash(): a collision would silently serve
one request another's K/V, and token ids are chosen by users, so the hash must not be one they
can collide on purpose. It costs about a microsecond per block.
"""

from __future__ import annotations

import hashlib
from array import array
from collections.abc import Iterator, Sequence

from folio.core.request import Request

BlockHash = bytes  # 16 bytes

_ROOT = b"folio-kv-block-v1"


def hash_block(parent: BlockHash | None, token_ids: Sequence[int], extra: bytes = b"") -> BlockHash:
    """The hash of a full block: its parent's hash (None for a request's first block), its
    token ids and any extra bytes that change its K/V."""
    return _hash_block_bytes(parent, array("q", token_ids).tobytes(), extra)


def _hash_block_bytes(parent: BlockHash | None, token_bytes: bytes | memoryview, extra: bytes) -> BlockHash:
    """hash_block of token ids already packed as 8-byte little-endian integers."""
    h = hashlib.sha256(_ROOT if parent is None else parent)
    h.update(len(extra).to_bytes(4, "little"))
    h.update(extra)
    h.update(token_bytes)
    return h.digest()[:16]


def request_block_hashes(request: Request, block_size: int, num_blocks: int) -> list[BlockHash]:
    """The hashes of the request's first num_blocks full blocks, extending request.block_hashes.

    Token ids only ever grow at the end, so a hash once computed stays valid; each block is
    hashed once in the request's life. num_blocks may not exceed the full blocks it holds.
    """
    _extend_hashes(request, block_size, num_blocks)
    return request.block_hashes[:num_blocks]


def lazy_block_hashes(request: Request, block_size: int, num_blocks: int, batch: int = 32) -> Iterator[BlockHash]:
    """request_block_hashes(request, block_size, num_blocks), computed `batch` blocks at a time as
    the caller reads on: a prefix-cache lookup stops at its first miss, so a new 30k-token prompt
    hashes one batch at admission, not all of its ~1,900 blocks; the rest are hashed when its
    chunks' blocks are registered (the later ones while the first chunk runs on the device)."""
    hashes = request.block_hashes
    start = 0
    while start < num_blocks:
        end = min(num_blocks, max(start + batch, len(hashes)))
        _extend_hashes(request, block_size, end)
        for i in range(start, end):
            yield hashes[i]
        start = end


def _extend_hashes(request: Request, block_size: int, num_blocks: int) -> None:
    """Hash the request's full blocks up to num_blocks that request.block_hashes lacks."""
    hashes = request.block_hashes
    if num_blocks > request.num_tokens // block_size:
        raise ValueError(
            f"{request.request_id}: {num_blocks} full blocks asked, it has "
            f"{request.num_tokens // block_size}."
        )
    first = len(hashes)
    if first >= num_blocks:
        return
    # The new blocks' ids packed once (a 30k-token prompt: ~25% less hashing time than packing
    # each block on its own), then hashed block by block along the chain.
    packed = memoryview(array("q", request.all_token_ids[first * block_size : num_blocks * block_size]).tobytes())
    extra = first_block_extra(request)
    stride = 8 * block_size
    for i in range(first, num_blocks):
        parent = hashes[i - 1] if i else None
        offset = (i - first) * stride
        hashes.append(_hash_block_bytes(parent, packed[offset : offset + stride], extra if i == 0 else b""))


def first_block_extra(request: Request) -> bytes:
    """The salt and the adapter: the salt length-prefixed whenever either is present (a salt
    alone included), so no salt a user picks can spell another's salt plus an adapter."""
    salt = request.cache_salt.encode() if request.cache_salt else b""
    adapter = request.lora_request.cache_key() if request.lora_request is not None else b""
    if not salt and not adapter:
        return b""
    return len(salt).to_bytes(4, "little") + salt + adapter
