"""Token-level fakes: a training row for trainer tests, a byte-level tokenizer in miniature for drift tests."""

from __future__ import annotations


class FakeTrainingRow:
    """A training row for trainer unit tests: loss on every token after the first ``prompt_len``, weight 1, no
    recorded logprobs (0.0: the ratio check is off in those tests)."""

    def __init__(self, ids: list[int], advantage: float, prompt_len: int = 2) -> None:
        self.input_ids = ids
        self.loss_mask = [0] * prompt_len + [1] * (len(ids) - prompt_len)
        self.old_logprobs = [0.0] * len(ids)
        self.weight = 1.0
        self.advantage = advantage


class FakeByteTokenizer:
    """A byte-level BPE in miniature for drift tests: ids 0-255 are bytes (spelled in GPT-2's byte alphabet),
    ``AB_ID`` is the one merge ``ab`` (so ``[97, 98]`` is a non-canonical spelling of ``ab``), ``EOS_ID`` the
    special ``<e>``. ``decode`` replaces invalid UTF-8 like a real byte-level decoder."""

    AB_ID, EOS_ID, EOS = 256, 257, "<e>"

    def __init__(self) -> None:
        self.eos_token_id = self.EOS_ID
        self.all_special_ids = [self.EOS_ID]
        self.added_tokens_decoder = {self.EOS_ID: self.EOS}

    def _bytes(self, token_id: int) -> bytes:
        return b"ab" if token_id == self.AB_ID else bytes([token_id])

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        out, run = [], b""
        for token_id in ids:
            if token_id == self.EOS_ID:
                out.append(run.decode("utf-8", errors="replace") + ("" if skip_special_tokens else self.EOS))
                run = b""
            else:
                run += self._bytes(token_id)
        return "".join(out) + run.decode("utf-8", errors="replace")

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        ids: list[int] = []
        for n, part in enumerate(text.split(self.EOS)):
            if n:
                ids.append(self.EOS_ID)
            data, i = part.encode(), 0
            while i < len(data):
                if data[i:i + 2] == b"ab":
                    ids.append(self.AB_ID)
                    i += 2
                else:
                    ids.append(data[i])
                    i += 1
        return ids

    def convert_ids_to_tokens(self, ids: list[int]) -> list[str]:
        from repro.tinymodel.qwen3_tokenizer import byte_alphabet

        alphabet = byte_alphabet()
        return [self.EOS if i == self.EOS_ID else "".join(alphabet[b] for b in self._bytes(i)) for i in ids]
