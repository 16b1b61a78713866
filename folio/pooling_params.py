"""PoolingParams and PoolerConfig: how an embedding is pooled, with vLLM's names (no torch).

PoolerConfig is the engine's default (vLLM's `pooler_config`: pooling_type LAST or MEAN,
normalize); PoolingParams overrides it per request (vLLM's `normalize`, and folio's
`pooling_type`). `dimensions` (Matryoshka truncation) is refused: no supported model is trained
for it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

POOLING_TYPES = ("LAST", "MEAN")


@dataclass(frozen=True)
class PoolerConfig:
    pooling_type: str = "LAST"  # vLLM's default for a *ForCausalLM run as an embedding model
    normalize: bool = True

    def __post_init__(self) -> None:
        if self.pooling_type not in POOLING_TYPES:
            raise ValueError(f"pooling_type must be one of {POOLING_TYPES}, got {self.pooling_type!r}.")
        if not isinstance(self.normalize, bool):
            raise ValueError(f"normalize must be true or false, got {self.normalize!r}.")

    @classmethod
    def from_dict(cls, raw: dict[str, Any] | None) -> PoolerConfig:
        if raw is None:
            return cls()
        if not isinstance(raw, dict):
            raise ValueError(f"pooler_config must be a dict, got {raw!r}.")
        unknown = sorted(set(raw) - {"pooling_type", "normalize"})
        if unknown:
            raise ValueError(f"pooler_config keys {unknown} are not supported (pooling_type and normalize are).")
        try:
            return cls(str(raw.get("pooling_type", "LAST")).upper(), raw.get("normalize", True))
        except ValueError as e:
            raise ValueError(f"pooler_config: {e}") from None


@dataclass(frozen=True)
class PoolingParams:
    normalize: bool | None = None  # None: the engine's pooler_config
    dimensions: int | None = None
    pooling_type: str | None = None  # folio's: "LAST" or "MEAN"; None: the engine's

    def __post_init__(self) -> None:
        if self.dimensions is not None:
            raise ValueError(f"dimensions={self.dimensions!r}: folio returns full-size embeddings only.")
        # Checked here, not when first resolved mid-embed (5 would fail there with an AttributeError).
        if self.pooling_type is not None and (
            not isinstance(self.pooling_type, str) or self.pooling_type.upper() not in POOLING_TYPES
        ):
            raise ValueError(f"pooling_type must be one of {POOLING_TYPES} (or None: the engine's), "
                             f"got {self.pooling_type!r}.")
        if self.normalize is not None and not isinstance(self.normalize, bool):
            raise ValueError(f"normalize must be true, false or None, got {self.normalize!r}.")

    def resolve(self, default: PoolerConfig) -> PoolerConfig:
        return PoolerConfig(
            pooling_type=(self.pooling_type or default.pooling_type).upper(),
            normalize=default.normalize if self.normalize is None else self.normalize,
        )
