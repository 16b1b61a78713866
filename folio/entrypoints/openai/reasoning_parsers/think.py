"""`<think>…</think>` reasoning: what is inside is reasoning_content, what follows is content.

Like the tool parsers, `split` sees the whole text so far and both parts only grow as it
grows (a tag cut at the end is held back). The two families differ in one case: text with no
`</think>` yet. DeepSeek-R1's template opens `<think>` in the prompt, so such text is reasoning
still being written; Qwen3 writes `<think>` itself, so text that does not start with it is the
answer (thinking switched off).
"""

from __future__ import annotations

from folio.entrypoints.openai.tool_parsers.base import held_back

START, END = "<think>", "</think>"


class ReasoningParser:
    # Whether text before any </think> is reasoning even without an opening <think>.
    implicit_start = False

    def split(self, text: str, final: bool) -> tuple[str | None, str]:
        """(reasoning_content or None, content)."""
        body = text.lstrip("\n")
        opened = body.startswith(START)
        if opened:
            body = body[len(START) :]
        elif not final and START.startswith(body):
            return None, ""  # may still become <think>
        elif not self.implicit_start:
            return None, text
        end = body.find(END)
        if end >= 0:
            return body[:end], body[end + len(END) :].lstrip("\n")
        if final and not opened and not self.implicit_start:
            return None, text
        return body if final else body[: held_back(body, END)], ""


class Qwen3ReasoningParser(ReasoningParser):
    implicit_start = False


class DeepSeekR1ReasoningParser(ReasoningParser):
    implicit_start = True
