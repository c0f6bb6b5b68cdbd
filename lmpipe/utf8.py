"""Generated text that is always valid UTF-8.

The byte-level BPE has a token for every byte, so a model may emit a token that starts a character another token
never finishes, or a continuation byte with no character to continue: decoded, such bytes become U+FFFD. `Utf8Guard`
knows, for a tokenizer, which tokens may follow the bytes generated so far (a UTF-8 decoder's states: how many
continuation bytes are still due, and the range the next one must fall in, RFC 3629), so decoding masks the others;
a text cut off inside a character at the length limit is held back to its last whole character.
"""

from __future__ import annotations

import functools

import numpy as np
from tokenizers import Tokenizer

# A decoder's states: (continuation bytes still due, the range the next byte must fall in); 0 is "between characters".
STATES = ((0, 0, 0), (1, 0x80, 0xBF), (2, 0xA0, 0xBF), (2, 0x80, 0xBF), (2, 0x80, 0x9F),
          (3, 0x90, 0xBF), (3, 0x80, 0xBF), (3, 0x80, 0x8F))
INVALID = -1


def _lead(byte: int) -> int:
    """The state after a character's first byte (RFC 3629's table of well-formed sequences), or INVALID."""
    if byte < 0x80:
        return 0
    if 0xC2 <= byte <= 0xDF:
        return STATES.index((1, 0x80, 0xBF))
    if 0xE0 <= byte <= 0xEF:
        return STATES.index({0xE0: (2, 0xA0, 0xBF), 0xED: (2, 0x80, 0x9F)}.get(byte, (2, 0x80, 0xBF)))
    if 0xF0 <= byte <= 0xF4:
        return STATES.index({0xF0: (3, 0x90, 0xBF), 0xF4: (3, 0x80, 0x8F)}.get(byte, (3, 0x80, 0xBF)))
    return INVALID


def step(state: int, data: bytes) -> int:
    """The state after `data` from `state`, or INVALID where a byte breaks UTF-8."""
    for byte in data:
        due, low, high = STATES[state]
        if due == 0:
            state = _lead(byte)
        elif low <= byte <= high:
            state = STATES.index((due - 1, 0x80, 0xBF)) if due > 1 else 0
        else:
            state = INVALID
        if state == INVALID:
            return INVALID
    return state


def _byte_decoder() -> dict[str, int]:
    """GPT-2's byte-level alphabet (what HF's ByteLevel pre-tokenizer writes tokens in) back to bytes."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars, extra = list(printable), 0
    for byte in range(256):
        if byte not in printable:
            printable.append(byte)
            chars.append(256 + extra)
            extra += 1
    return {chr(c): b for b, c in zip(printable, chars)}


class Utf8Guard:
    """Which tokens may follow the text so far: `successor[state, token]` is the state after the token, or INVALID.
    A special token (the boundary) stands between characters and leaves the state there."""

    def __init__(self, token_bytes: list[bytes | None]):
        self.successor = np.full((len(STATES), len(token_bytes)), INVALID, dtype=np.int8)
        for token, data in enumerate(token_bytes):
            for state in range(len(STATES)):
                self.successor[state, token] = (0 if state == 0 else INVALID) if data is None else step(state, data)
        self.allowed = self.successor != INVALID  # (states, vocabulary)

    @classmethod
    def for_tokenizer(cls, tokenizer: Tokenizer) -> "Utf8Guard":
        return _guard(tokenizer.to_str())

    def state_after(self, tokens, state: int = 0) -> int:
        """The state after `tokens` (a prompt ends between characters; one that does not starts afresh)."""
        for token in tokens:
            state = int(self.successor[state, token])
            if state == INVALID:
                return 0
        return state

    def restrict(self, p: np.ndarray, state: int) -> np.ndarray:
        """`p` over the tokens that keep the bytes valid, renormalised (p itself where none of them has mass)."""
        kept = np.where(self.allowed[state], p, 0.0)
        total = kept.sum()
        return kept / total if total > 0 else p

    def whole(self, tokens: list[int], state: int = 0) -> list[int]:
        """The longest prefix of `tokens` that ends between characters: a text cut off inside one is held back."""
        last = 0
        for i, token in enumerate(tokens):
            state = int(self.successor[state, token])
            if state == INVALID:
                break
            if state == 0:
                last = i + 1
        return list(tokens[:last])


@functools.lru_cache(maxsize=4)
def _guard(tokenizer_json: str) -> Utf8Guard:
    tokenizer = Tokenizer.from_str(tokenizer_json)
    special = set(tokenizer.get_added_tokens_decoder())
    to_byte = _byte_decoder()
    token_bytes = []
    for token in range(tokenizer.get_vocab_size()):
        text = tokenizer.id_to_token(token)
        if token in special or text is None or any(c not in to_byte for c in text):
            token_bytes.append(None)  # text of its own (decoded as written): only between characters
        else:
            token_bytes.append(bytes(to_byte[c] for c in text))
    return Utf8Guard(token_bytes)
