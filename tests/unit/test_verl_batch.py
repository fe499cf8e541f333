"""repro's rows as verl's batch (``repro.verl.batch``, pure torch): each row's prompt and response, masks, sampling
logprobs, reward and advantage land where verl's actor reads them, row for row."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from repro.verl.batch import batch_tensors, non_tensor_fields, rows_from_json, rows_to_json, split_row
from tests.support import recorded_rows


def test_each_row_is_its_prompt_left_padded_and_its_response_right_padded() -> None:
    rows = recorded_rows(vocab=500)
    assert len(rows) == 12 and {len(r.call_seqs) for r in rows} == {1, 2}  # merged and broken rows
    fields = batch_tensors(rows, pad_id=0)
    width_p, width_r = fields["prompts"].shape[1], fields["responses"].shape[1]
    for i, row in enumerate(rows):
        first = row.loss_mask.index(1)
        n_prompt, n_response = first, len(row.input_ids) - first
        attention = fields["attention_mask"][i]
        assert attention.tolist() == [0] * (width_p - n_prompt) + [1] * (n_prompt + n_response) + [0] * (
            width_r - n_response)
        assert fields["input_ids"][i][attention.bool()].tolist() == row.input_ids  # the row's tokens, in order
        assert fields["response_mask"][i, :n_response].tolist() == row.loss_mask[first:]
        assert fields["response_mask"][i, n_response:].sum() == 0
        sampled = fields["response_mask"][i].bool()
        assert fields["rollout_log_probs"][i][sampled].tolist() == pytest.approx(
            [lp for lp, m in zip(row.old_logprobs, row.loss_mask, strict=True) if m])
        assert fields["advantages"][i][sampled].tolist() == pytest.approx([row.advantage] * int(sampled.sum()))
        last = max(j for j, m in enumerate(row.loss_mask[first:]) if m)
        assert fields["token_level_rewards"][i].nonzero().flatten().tolist() in ([last], [])
        assert float(fields["token_level_rewards"][i, last]) == row.reward
        positions = fields["position_ids"][i][attention.bool()].tolist()
        assert positions == list(range(len(row.input_ids)))
    merged = next(i for i, r in enumerate(rows) if len(r.call_seqs) == 2)
    assert 0 in fields["response_mask"][merged, :len(split_row(rows[merged])[1])].tolist()  # the observation
    extra = non_tensor_fields(rows)
    assert list(extra["uid"]) == [r.group_id for r in rows] and list(extra["weight"]) == [r.weight for r in rows]


def test_rows_cross_to_verls_environment_as_json_unchanged(tmp_path: Path) -> None:
    rows = recorded_rows(vocab=500)
    back = rows_from_json(rows_to_json(rows, tmp_path / "rows.json"))
    assert [torch.equal(batch_tensors(rows, 0)[k], batch_tensors(back, 0)[k]) for k in ("input_ids", "advantages")] \
        == [True, True]


def test_a_row_verl_cannot_train_on_is_refused_with_its_reason() -> None:
    row = recorded_rows(vocab=500)[0]
    row.loss_mask = [0] * len(row.loss_mask)
    with pytest.raises(ValueError, match="no sampled token"):
        split_row(row)
    row.loss_mask = [1] * len(row.loss_mask)
    with pytest.raises(ValueError, match="no prompt"):
        split_row(row)
