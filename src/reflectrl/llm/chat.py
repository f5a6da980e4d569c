"""Episodes as conversations for a model with a chat template, token-exact.

A model whose tokenizer has a chat template gets each episode as a conversation: the task's instruction and
problem as the first user turn, the agent's answers as assistant turns, and the environment's replies (query
results, search results, the self-report question) as further user turns. :class:`ChatFormat` learns from the
template, once, the text around each kind of turn (by rendering small conversations with placeholder contents)
and then encodes the pieces of an episode separately:

- ``prompt_ids(text)``: the template's rendering of ``[user: text]`` with the generation prompt (a default system
  prompt is the template's own);
- the agent's turn: the ids as sampled, ending with the template's end-of-turn token when the model closed the
  turn itself (generation stops at it);
- ``reply_ids(text, closed)``: what follows an agent turn up to the next one: the end-of-turn token when the agent
  did not close its turn (a stop sequence or the token budget ended it), the template's text between turns, the
  user turn with ``text``, and the opening of the next assistant turn (plus a reply's ``prefill``).

So the ids a turn was sampled with are the ids it is trained on, and the transcript is never tokenized again.
Where the agent's sampled ids are the tokenizer's own encoding of their text, the assembled ids equal the
tokenization of the template's rendering of the same conversation, but for the newline the template writes after
the last end-of-turn (``tests/llm/test_chat.py``); docs/llm.md ("Chat models") says where else they may differ.
"""

from __future__ import annotations

from typing import Any

from ..errors import ConfigError

_USER1, _AGENT, _USER2 = "REFLECTRLUSERONE", "REFLECTRLAGENTTURN", "REFLECTRLUSERTWO"


def _render(tok: Any, messages: list[dict[str, str]], generation_prompt: bool) -> str:
    return tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation_prompt)


class ChatFormat:
    """The turn layout of a tokenizer's chat template (see the module docstring)."""

    def __init__(self, tokenizer: Any, system: str | None = None):
        self.tok, self.system = tokenizer, system
        head = [{"role": "system", "content": system}] if system else []
        first = head + [{"role": "user", "content": _USER1}]
        try:
            prompt = _render(tokenizer, first, True)
            one = _render(tokenizer, first + [{"role": "assistant", "content": _AGENT}], False)
            two = _render(tokenizer, first + [{"role": "assistant", "content": _AGENT},
                                              {"role": "user", "content": _USER2}], True)
        except Exception as exc:  # a template error (jinja raises its own types)
            raise ConfigError(f"the model's chat template cannot render a user/assistant conversation "
                              f"({type(exc).__name__}: {exc}); use --chat off for raw prompts") from None
        if not (one.startswith(prompt) and two.startswith(one) and one[len(prompt):].startswith(_AGENT)):
            raise ConfigError("the model's chat template renders an earlier turn differently once a later one "
                              "follows, so episodes cannot be assembled turn by turn; use --chat off for raw prompts")
        self.prompt_head, self.prompt_tail = prompt.split(_USER1)
        after_agent = one[len(prompt) + len(_AGENT):]  # e.g. "<|im_end|>\n"
        ids = tokenizer(after_agent, add_special_tokens=False)["input_ids"]
        special = set(getattr(tokenizer, "all_special_ids", []) or []) | set(getattr(tokenizer, "added_tokens_decoder", {}))
        if not ids or ids[0] not in special:
            raise ConfigError(f"the model's chat template ends an assistant turn with {after_agent!r}, not with a "
                              "special token that generation could stop at; use --chat off for raw prompts")
        self.end_of_turn = int(ids[0])
        self.end_text = tokenizer.decode([self.end_of_turn], skip_special_tokens=False)
        if not after_agent.startswith(self.end_text):
            raise ConfigError(f"cannot locate the end-of-turn token {self.end_text!r} in the chat template's output")
        # e.g. "\n<|im_start|>user\nTWO<|im_end|>\n<|im_start|>assistant\n"
        between = after_agent[len(self.end_text):] + two[len(one):]
        self.reply_head, self.reply_tail = between.split(_USER2)

    # ----------------------------------------------------------------------------- text
    def prompt_text(self, text: str, prefill: str = "") -> str:
        """The template's first turn: (system,) the user's ``text``, the opening of the assistant's turn."""
        return self.prompt_head + text + self.prompt_tail + prefill

    def reply_text(self, text: str, closed: bool, prefill: str = "") -> str:
        """What follows an agent turn: its end-of-turn unless ``closed``, then the user turn ``text`` and the
        opening of the next assistant turn, then ``prefill``."""
        return ("" if closed else self.end_text) + self.reply_head + text + self.reply_tail + prefill

    # ----------------------------------------------------------------------------- ids
    def encode(self, text: str) -> list[int]:
        return list(self.tok(text, add_special_tokens=False)["input_ids"])

    def prompt_ids(self, text: str, prefill: str = "") -> list[int]:
        return self.encode(self.prompt_text(text, prefill))

    def reply_ids(self, text: str, closed: bool, prefill: str = "") -> list[int]:
        return self.encode(self.reply_text(text, closed, prefill))


def chat_format(tokenizer: Any, mode: str = "auto") -> ChatFormat | None:
    """The :class:`ChatFormat` of a tokenizer: ``auto`` when it has a chat template (None without one), ``off``
    never (raw prompts), ``on`` always (an error without a template)."""
    if mode not in ("auto", "on", "off"):
        raise ConfigError(f"chat must be auto, on or off, got {mode!r}")
    has = bool(getattr(tokenizer, "chat_template", None))
    if mode == "off" or (mode == "auto" and not has):
        return None
    if not has:
        raise ConfigError("--chat on needs a tokenizer with a chat template; this one has none")
    return ChatFormat(tokenizer)
