"""vLLM-named command-line flags: one per VLLM_ARGS row, and `--help` grouped as vLLM groups it.

add_vllm_flags adds a flag for each table row that has a CLI spec and no flag yet (an EngineArgs
field that already has one keeps it). group_like_vllm then moves every engine flag into a group
named after vLLM's config class (ModelConfig, CacheConfig, ...), so `folio serve --help` reads
like `vllm serve --help`.
"""

from __future__ import annotations

import argparse
from typing import Any

from folio.engine.vllm_args import VLLM_ARGS, Status

# Section order of vLLM's `serve --help`; "Frontend" holds the server's own flags.
GROUP_ORDER = ("Frontend", "ModelConfig", "LoadConfig", "StructuredOutputsConfig", "ParallelConfig",
               "CacheConfig", "MultiModalConfig", "LoRAConfig", "ObservabilityConfig", "SchedulerConfig",
               "SpeculativeConfig", "VllmConfig")
# folio's own engine flags that are not vLLM arguments, and where they sit.
FOLIO_FLAG_GROUPS = {
    "device": "ModelConfig",
    "attention_backend": "ModelConfig",
    "cpu_kv_cache_space": "CacheConfig",
}


def _has_dest(parser: argparse.ArgumentParser, dest: str) -> bool:
    return any(action.dest == dest for action in parser._actions)


def add_vllm_flags(parser: argparse.ArgumentParser) -> None:
    """A flag for every table row with a CLI spec that the parser does not have yet."""
    for action in parser._actions:
        if action.dest == "served_model_name":
            action.nargs = "+"  # vLLM's form; more than one name is refused (vllm_args)
    group = parser.add_argument_group("vLLM compatibility")
    for row in VLLM_ARGS:
        if row.cli is None or _has_dest(parser, row.name):
            continue
        spec: dict[str, Any] = dict(row.cli)
        aliases = spec.pop("aliases", [])
        if row.status is not Status.HONOURED:
            spec.setdefault("help", f"{row.status.value}: {row.note}" if row.note else row.status.value)
        else:
            spec.setdefault("help", row.note)
        group.add_argument(row.flag, *aliases, dest=row.name, **spec)


def group_like_vllm(parser: argparse.ArgumentParser) -> None:
    """Move each vLLM-named flag into a group titled with vLLM's config class, in vLLM's order
    (help text only: parsing is unaffected). Flags vLLM does not have stay where they are.
    argparse has no public way to move an action, so this edits its group lists."""
    where = {row.name: row.group for row in VLLM_ARGS} | FOLIO_FLAG_GROUPS
    existing = {group.title: group for group in parser._action_groups}
    sections = {name: existing.get(name) or parser.add_argument_group(name) for name in GROUP_ORDER}
    for group in list(parser._action_groups):
        for action in list(group._group_actions):
            target = sections.get(where.get(action.dest, ""))
            if target is None or target is group:
                continue
            group._group_actions.remove(action)
            target._group_actions.append(action)
    for group in list(parser._action_groups):
        if not group._group_actions and group.title not in ("positional arguments", "options"):
            parser._action_groups.remove(group)
    # vLLM's order: positional, options, then the sections in GROUP_ORDER, then anything else.
    rank = {name: i for i, name in enumerate(GROUP_ORDER)}
    parser._action_groups.sort(key=lambda g: (g.title not in ("positional arguments", "options"),
                                               rank.get(g.title, len(rank))))
