"""A draft/target pair for speculative decoding benchmarks: two Llamas of different sizes
trained on the demo corpus with the demo tokenizer, so acceptance rates are real numbers.

    python -m folio.benchmarks.spec_decode_pair --out /tmp/spec-pair --device cuda

writes OUT/draft (2 layers of width 128, ~0.5 M parameters) and OUT/target (24 layers of width
512, ~75 M parameters). At batch 1 both are bound by kernel launches, not by bytes, so what
decides speculation's gain is the draft's cost per step relative to the target's: latency
scales with depth, hence a deep target and a shallow draft (~1/12 of its step, like EAGLE's
one-layer draft heads against a 32-layer model; real 8B/1B pairs sit near 1/4 but their target
steps are 6 ms, not ~1 ms, so fixed per-step host work weighs less). The session-5 pair (12 x
1024 target, 3 x 128 draft) is `--target-layers 12 --target-hidden 1024 --draft-layers 3`.
On an H100 both train in a few minutes; on a CPU use --target-layers 2 --target-hidden 256
--steps 20 --batch-size 2 for a quick check. Until session 6 the windows were 32 x 128 tokens
(`--batch-size 32 --seq-len 128`) of the documents alone.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import replace

from folio.demo.model import DemoModelShape, build_demo_model
from folio.demo.trainer import TrainingRecipe


def target_shape(hidden: int, layers: int) -> DemoModelShape:
    heads = max(4, hidden // 64)
    return DemoModelShape(
        hidden_size=hidden,
        intermediate_size=hidden * 11 // 4,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=max(1, heads // 2),
    )


def build_pair(
    out: str,
    device: str,
    steps: int,
    target_hidden: int,
    target_layers: int,
    batch_size: int = 8,
    draft_layers: int = 2,
    seq_len: int = 512,
) -> tuple[str, str]:
    """Train and save the draft and the target; returns their folders. The corpus includes
    each document followed by a quote of itself, in windows of seq_len tokens that hold such a
    pair whole: the copy-heavy benchmark asks the target to continue a quote of its prompt, which
    a model that never saw text repeat does by memory alone, and badly (session 6: trained on
    the documents only, in 128-token windows, its greedy outputs quoted 37% of what they were
    asked to)."""
    draft, target = os.path.join(out, "draft"), os.path.join(out, "target")
    recipe = TrainingRecipe(steps=steps, batch_size=batch_size, seq_len=seq_len, num_threads=os.cpu_count() or 1,
                            quote_repeats=1)  # each document also quoted after itself: see the docstring
    build_demo_model(draft, DemoModelShape(num_hidden_layers=draft_layers), replace(recipe, lr=5e-3), device=device)
    build_demo_model(target, target_shape(target_hidden, target_layers), replace(recipe, lr=1e-3), device=device)
    return draft, target


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="folder for draft/ and target/")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--steps", type=int, default=1500)
    parser.add_argument("--target-hidden", type=int, default=512)
    parser.add_argument("--target-layers", type=int, default=24)
    parser.add_argument("--draft-layers", type=int, default=2, help="the draft: the demo shape with this many layers")
    parser.add_argument("--batch-size", type=int, default=8, help="windows per step")
    parser.add_argument("--seq-len", type=int, default=512, help="tokens per window (8 x 512: as many per step as 32 x 128)")
    args = parser.parse_args()
    draft, target = build_pair(
        args.out, args.device, args.steps, args.target_hidden, args.target_layers, args.batch_size, args.draft_layers,
        args.seq_len,
    )
    print(f"draft: {draft}\ntarget: {target}")


if __name__ == "__main__":
    main()
