"""Retokenization drift from hand-made calls (repro.evaluation.retokenization) and its table
(repro.report.tokenizer_drift_table): every count is checked against a rollout whose answer is known."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from repro.evaluation.metrics import wilson_interval
from repro.evaluation.retokenization import (
    Share,
    break_cause,
    canonical_ids,
    prefix_drift,
    prompt_lengths,
    refused_prompt_tokens,
    retokenization,
    token_bytes,
    total_share,
)
from repro.report.tables import write_tables
from repro.report.tokenizer_drift_table import drift_markdown, newest_per_harness, row, share_cell
from repro.store.trace_records import CallRecord
from repro.testing import FakeByteTokenizer

TOK = FakeByteTokenizer()
AB, EOS = TOK.AB_ID, TOK.EOS_ID
A, B, X = 97, 98, 120  # "a", "b", "x"


def call(seq: int, prompt: list[int] | None, completion: list[int] | None, purpose: str = "policy",
         flag: bool | None = None, error: str | None = None) -> CallRecord:
    return CallRecord("r", seq, "chat", "ok" if completion is not None else "error", prompt_ids=prompt,
                      completion_ids=completion, purpose=purpose, extends_previous=flag, error=error)


def test_the_fake_tokenizer_has_one_non_canonical_spelling() -> None:
    assert TOK.encode("ab") == [AB] and TOK.decode([A, B]) == "ab"
    assert canonical_ids(TOK, [A, B, EOS], [EOS]) == [AB, EOS]
    assert canonical_ids(TOK, [AB], [EOS]) == [AB]
    assert token_bytes(TOK, [AB, 0xC3, EOS]) == b"ab\xc3<e>"


@pytest.mark.parametrize(("prompt", "cause"), [
    ([1, 2, A, B, EOS, 7], None),                # the sampled ids are kept: no break
    ([1, 2, AB, EOS, 7], "retokenized"),         # the reply's text back as its canonical ids
    ([1, 2, X, EOS, 7], "reply_rewritten"),      # the history kept, the reply is other text
    ([1, 3, 7], "history_changed"),              # the previous prompt is not a prefix (a dropped reply)
])
def test_break_cause(prompt: list[int], cause: str | None) -> None:
    assert break_cause([1, 2], [A, B, EOS], prompt, canonical_ids(TOK, [A, B, EOS], [EOS])) == cause


def test_prefix_drift_counts_turns_per_purpose_from_the_ids() -> None:
    calls = [
        call(0, [1, 2], [A, B, EOS]),
        call(1, [50], [X], purpose="auxiliary"),               # a side call: its own chain, one call
        call(2, [1, 2, A, B, EOS, 7], [A, B]),                 # extends (flag says so)
        call(3, [1, 2, A, B, EOS, 7, AB, EOS, 8], [X, EOS], flag=True),  # retokenized, the flag wrong
        call(4, None, None, error="upstream 500"),             # no ids: not comparable
        call(5, [1, 2, A, B, EOS, 7, AB, EOS, 8, X, EOS, 9], [A, B, EOS]),  # compared with seq 3: extends
        call(6, [1, 2, A, B, EOS, 7, AB, EOS, 8, X, EOS, 9, 0x63, EOS], [X], flag=False),  # rewritten
        call(7, [1, 9], [X]),                                 # history changed
    ]
    out = prefix_drift([calls], TOK, [EOS])
    policy = out["policy"]
    assert (policy["turns"], policy["breaks"]) == (5, 3)
    assert (policy["retokenized"], policy["reply_rewritten"], policy["history_changed"]) == (1, 1, 1)
    assert policy["not_comparable"] == 1 and policy["flag_disagrees"] == 1
    assert out["auxiliary"]["turns"] == 0
    assert policy["share"] == Share(3, 5).to_dict()
    assert total_share(out) == {"k": 3, "n": 5, "rate": 0.6, "ci_low": wilson_interval(3, 5)[0],
                                "ci_high": wilson_interval(3, 5)[1]}


def test_prefix_drift_starts_each_rollout_afresh() -> None:
    first = [call(0, [1], [A]), call(1, [1, A, 2], [B])]
    second = [call(0, [5], [X])]  # unrelated to the first rollout's last call: no turn
    assert prefix_drift([first, second], TOK, [EOS])["policy"]["turns"] == 1


def test_retokenization_counts_non_canonical_completions_and_invalid_utf8() -> None:
    calls = [call(0, [1], [A, B, EOS]),     # "ab" sampled as two tokens: non-canonical
             call(1, [1], [AB]),            # canonical
             call(2, [1], [X, 0xC3]),       # half a UTF-8 character: decodes to U+FFFD, re-encodes otherwise
             call(3, [1], [EOS]),           # only the end token: no text, not counted
             call(4, [1], [X, X], purpose="summary"),
             call(5, None, None)]
    out = retokenization(calls, TOK, [EOS])
    policy = out["policy"]
    assert (policy["completions"], policy["non_canonical"], policy["invalid_utf8"]) == (3, 2, 1)
    assert policy["tokens"] == 5 and policy["canonical_tokens"] == 1 + 1 + 1 + 3
    assert out["summary"]["non_canonical"] == 0
    assert total_share(out, "non_canonical", "completions")["k"] == 2


def test_share_interval_is_wilson() -> None:
    share = Share(2, 10).to_dict()
    assert (share["ci_low"], share["ci_high"]) == pytest.approx(wilson_interval(2, 10))
    assert Share(0, 0).to_dict()["rate"] is None
    assert share_cell(share, "turns") == f"20.0% [{100 * share['ci_low']:.1f}, {100 * share['ci_high']:.1f}%] (2/10)"
    assert share_cell(Share(0, 0).to_dict(), "turns") == "- (0 turns)"


def test_prompt_lengths_read_refusals() -> None:
    refusal = ("This model's maximum context length is 8192 tokens. However, your request has 12034 input "
               "tokens. Please reduce the length of the input messages.")
    assert refused_prompt_tokens(refusal) == 12034
    out = prompt_lengths([[call(0, None, None, error=refusal)], [call(0, [1] * 10, [A]), call(1, [1] * 30, [A])]],
                         8192)
    assert out == {"max_model_len": 8192, "first_prompt_median": 6022, "max_prompt": 12034, "refused_calls": 1,
                   "refused_max": 12034}


def _metrics(harness: str, **extra: object) -> dict:
    calls = [call(0, [1, 2], [A, B, EOS]), call(1, [1, 2, AB, EOS, 7], [X])]
    prefix, retok = prefix_drift([calls], TOK, [EOS]), retokenization(calls, TOK, [EOS])
    return {"kind": "tokenizer_drift", "experiment": "fidelity_real_tokenizer", "table": "fidelity_real_tokenizer",
            "harness": harness, "model": "m", "tokenizer": "qwen3", "temperature": 1.0, "max_tokens": 64,
            "task_distribution": "bundled:x", "rollouts": 1, "calls": 2, "calls_ok": 2, "prefix_drift": prefix,
            "prefix_drift_all": total_share(prefix), "retokenization": retok,
            "retokenization_all": total_share(retok, "non_canonical", "completions"),
            "prompt_tokens": prompt_lengths([calls], 8192), "started_at": 1.0} | extra


def test_a_harness_over_the_context_reports_its_prompt_length() -> None:
    lengths = {"max_model_len": 8192, "first_prompt_median": 12034, "max_prompt": 12034, "refused_calls": 4,
               "refused_max": 12034}
    cells = row(_metrics("opencode@1", calls_ok=0, prompt_tokens=lengths, prefix_drift={}, retokenization={}))
    assert "12034 tokens > max_model_len 8192" in cells["(a) prompt is not previous prompt + completion"]
    assert "%" not in cells["(b) non-canonical completions"]


def test_repro_table_publishes_the_drift_table(tmp_path: Path) -> None:
    for n, harness in enumerate(["mini-swe-agent@2.4.6", "openhands@1.58.2"]):
        run = tmp_path / "outputs" / "tokenizer_drift" / "t" / str(n)
        run.mkdir(parents=True)
        (run / "overrides.txt").write_text(f"experiment=tokenizer_drift\nharness=h{n}\n")
        (run / "metrics.json").write_text(json.dumps(_metrics(harness, run_dir=str(run))))
    written = write_tables(tmp_path / "outputs", tmp_path / "results")
    assert {p.name for p in written} == {"fidelity_real_tokenizer.md", "fidelity_real_tokenizer.csv"}
    text = (tmp_path / "results" / "fidelity_real_tokenizer.md").read_text()
    assert "| mini-swe-agent@2.4.6 | Qwen3 (151,669 ids) |" in text
    assert "100.0% [" in text and "(1/1)" in text  # one turn, retokenized: a break
    assert "Command: `repro run -m experiment=tokenizer_drift harness=h0,h1`" in text
    assert "Earlier rows" not in text
    (tmp_path / "results" / "fidelity_real_tokenizer_20261202.md").write_text("# kept verbatim\n")
    write_tables(tmp_path / "outputs", tmp_path / "results")  # a table kept from before run records is pointed to
    text = (tmp_path / "results" / "fidelity_real_tokenizer.md").read_text()
    assert "kept verbatim (their runs are not in `results/runs/`): `fidelity_real_tokenizer_20261202.md`" in text


def test_random_init_and_warm_started_runs_of_a_harness_each_keep_their_row() -> None:
    warm = {"demo_rollouts": 64, "sft": {"steps": 320, "loss_first": 11.9, "loss_last": 0.41}}
    runs = [_metrics("opencode@1", started_at=t, run_dir=f"outputs/r{t}", warm_start=w)
            for t, w in [(1.0, None), (2.0, warm), (3.0, None)]]
    chosen = newest_per_harness(runs)
    assert [r["started_at"] for r in chosen] == [3.0, 2.0]  # newest random init first, then the warm start
    assert [row(r)["model"] for r in chosen] == [
        "random init", "SFT on 64 expert demos (320 steps, loss 11.90 -> 0.41)"]
    assert "*SFT* rows fine-tune it" in drift_markdown(chosen) and "*random init* rows" in drift_markdown(chosen)


def test_a_replay_the_loop_cannot_continue_counts_the_rest_as_divergent(monkeypatch: pytest.MonkeyPatch) -> None:
    from repro.rl.rebuilt import fidelity

    class StopsAfterOneCall:  # like a chat template that re-renders earlier turns (TokenConversation refuses)
        def __init__(self, spec: object, tokenizer: object, model: fidelity.ReplayModel, workdir: object) -> None:
            self.model, self.conversation = model, None

        def run(self, task: str) -> str:
            self.model.complete([1, 2])
            raise ValueError("the chat template re-renders earlier messages")

    monkeypatch.setattr(fidelity, "RebuiltLoop", StopsAfterOneCall)
    calls = [call(0, [1, 2], [A]), call(1, [1, 2, A, 3], [B])]
    result = fidelity.replay_rollout(calls, "task", None, TOK, ".")
    assert result.rebuilt_exit.startswith("ValueError: the chat template")
    assert [t.identical for t in result.turns] == [True, False]


def test_the_first_prompt_is_the_first_policy_calls() -> None:
    calls = [call(0, [1] * 5, [A], purpose="auxiliary"), call(1, [1] * 40, [A])]
    assert prompt_lengths([calls], 100)["first_prompt_median"] == 40
