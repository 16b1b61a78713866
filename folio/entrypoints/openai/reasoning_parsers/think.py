"""`<think>…</think>` reasoning: what is inside is reasoning_content, what follows is content.

Like the tool parsers, `split` sees the whole text so far and both parts only grow as it
grows (a tag cut at the end is held back). The two families differ in one case: text with no
`</think>` yet. DeepSeek-R1's template opens `<think>` in the prompt, so such text is reasoning
still being written; Qwen3 writes `<think>` itself, so text that does not start with it is the
answer (thinking switched off) -- unless the prompt itself ends with `<think>` (Qwen3 thinking
models' and Qwen3.5's templates), which the server tells split() with `opened`.
"""

from __future__ import annotations

from folio.entrypoints.openai.tool_parsers.base import held_back

START, END = "<think>", "</think>"


class ReasoningParser:
    # Whether text before any </think> is reasoning even without an opening <think>.
    implicit_start = False

    def split(self, text: str, final: bool, opened: bool = False) -> tuple[str | None, str]:
        """(reasoning_content or None, content). `opened`: the prompt ends with <think> (as the
        templates of Qwen3 thinking models and Qwen3.5 write it), so the text starts inside it."""
        body = text.lstrip("\n")
        if body.startswith(START):  # written by the model (once more, if the prompt opened it)
            body, opened = body[len(START) :], True
        elif not final and START.startswith(body):
            return None, ""  # may still become <think>
        elif not (opened or self.implicit_start):
            return None, text
        end = body.find(END)
        if end >= 0:
            return body[:end], body[end + len(END) :].lstrip("\n")
        return body if final else body[: held_back(body, END)], ""


class Qwen3ReasoningParser(ReasoningParser):
    implicit_start = False


class DeepSeekR1ReasoningParser(ReasoningParser):
    implicit_start = True
