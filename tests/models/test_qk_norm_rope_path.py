"""The CUDA attention path (Qwen3: q/k head norms, rotary and the K/V store in one kernel;
Llama: rotary and the K/V store) run on the CPU through the Triton interpreter: the same greedy
tokens and log-probs as the module path (RMSNorm, rotary, then the attention's own store), which
is tested against transformers."""

from __future__ import annotations

import pytest

from folio import LLM, SamplingParams
from tests.helpers.checkpoints import tiny_model_dir

pytestmark = pytest.mark.slow


def _run(path):
    llm = LLM(model=path, dtype="float32", device="cpu", max_model_len=128, num_gpu_blocks_override=64)
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, logprobs=2)
    prompts = [{"prompt_token_ids": [5, 17, 33, 2, 9]}, {"prompt_token_ids": list(range(3, 40))}]
    return [(o.outputs[0].token_ids, [{t: lp.logprob for t, lp in d.items()} for d in o.outputs[0].logprobs])
            for o in llm.generate(prompts, params, use_tqdm=False)], llm


@pytest.mark.parametrize("kind", ["qwen3", "llama"])
def test_fused_path_equals_the_module_path(tmp_path_factory, monkeypatch, kind):
    import folio.layers.rotary_embedding as rotary_embedding
    from folio.layers.attention import Attention
    from folio.kernels.qk_norm_rope import KVWrite

    path = tiny_model_dir(tmp_path_factory, kind)
    want, _ = _run(path)
    writes = []
    monkeypatch.setattr(rotary_embedding, "use_triton_for", lambda x: True)

    def fused_kv_write(self, value, attn_metadata):  # the Triton-backend rule, minus the backend
        if self.kv_cache is None:
            return None
        writes.append(1)
        return KVWrite(value, self.kv_cache, attn_metadata.slot_mapping)

    monkeypatch.setattr(Attention, "fused_kv_write", fused_kv_write)
    got, llm = _run(path)
    assert writes  # the kernel stored K and V; the torch attention read them from the cache
    assert [g[0] for g in got] == [w[0] for w in want]
    for (_, got_lps), (_, want_lps) in zip(got, want):
        for g, w in zip(got_lps, want_lps):
            assert g.keys() == w.keys() and all(abs(g[t] - w[t]) < 1e-4 for t in g)
