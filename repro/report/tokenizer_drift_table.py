"""Tables of ``tokenizer_drift`` runs (``results/fidelity_real_tokenizer.md`` + ``.csv``): retokenization drift
per harness on a real tokenizer, one row per harness and model (random init, warm-started; its newest run), with
the commands that produced them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd

from repro.report.cells import pct, run_name
from repro.report.sweep_table import sweep_commands
from repro.report.table_files import by_table

PROMPT_COLUMN = "prompt tokens (first policy call median / max of context)"
TOKENIZER_NAMES = {"qwen3": "Qwen3 (151,669 ids)", "bpe": "recipe BPE"}


def share_cell(share: dict[str, Any] | None, unit: str = "") -> str:
    """``34.2% [25.1, 44.6] (41/120)``; ``- (0/0)`` when nothing was counted."""
    if not share or not share.get("n"):
        return f"- (0{unit and ' ' + unit})"
    low, high = pct(share["ci_low"]).rstrip("%"), pct(share["ci_high"])
    return f"{pct(share['rate'])} [{low}, {high}] ({share['k']}/{share['n']})"


def newest_per_harness(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The newest run per (harness, random init or warm-started model), the random init first."""
    newest: dict[tuple[str, bool], dict[str, Any]] = {}
    for run in sorted(runs, key=lambda r: r.get("started_at", 0)):
        newest[(run["harness"], bool(run.get("warm_start")))] = run
    return [newest[key] for key in sorted(newest)]


def _exceeds_context(run: dict[str, Any]) -> bool:
    """Every call the server got was refused as too long: the harness's prompts do not fit the model."""
    lengths = run["prompt_tokens"]
    return lengths["refused_calls"] > 0 and run["calls_ok"] == 0


def _causes(prefix: dict[str, Any]) -> str:
    totals = {c: sum(p.get(c, 0) for p in prefix.values()) for c in ("retokenized", "reply_rewritten",
                                                                      "history_changed")}
    return ", ".join(f"{c.replace('_', ' ')} {n}" for c, n in totals.items() if n) or "-"


def model_cell(run: dict[str, Any]) -> str:
    """``random init``, or the warm start: demonstrations, SFT steps and its loss from first to last log."""
    warm = run.get("warm_start")
    if not warm:
        return "random init"
    sft = warm["sft"]
    loss = f", loss {sft['loss_first']:.2f} -> {sft['loss_last']:.2f}" if sft.get("loss_first") is not None else ""
    return f"SFT on {warm['demo_rollouts']} expert demos ({sft['steps']} steps{loss})"


def _model_text(chosen: list[dict[str, Any]]) -> str:
    models = ", ".join(sorted({f"`{r['model']}`" for r in chosen}))
    text = f"Models {models}: the tiny Qwen3-architecture model initialised from one seed"
    if any(r.get("warm_start") for r in chosen):
        text += (". *SFT* rows fine-tune it on the scripted expert's demonstrations recorded through the same harness "
                 "on tasks of the train split, so that it makes that harness's tool calls and its rollouts have turns "
                 "(the model's name is the warm start's cache key)")
    if not all(r.get("warm_start") for r in chosen):
        text += ". *random init* rows sample from it untrained (the name is a cache key that also covers the corpus)"
    return text


def _caveats(chosen: list[dict[str, Any]]) -> str:
    parts = []
    if any(r.get("warm_start") for r in chosen):
        parts.append("A fine-tuned tiny model is still a weak policy: at temperature 1 its tool calls are often "
                     "malformed; the rates describe what such a sampler produces in each harness, not a capable model.")
    if not all(r.get("warm_start") for r in chosen):
        parts.append("A random-init model rarely emits a well-formed action, so most rollouts end early (format "
                     "errors, a reply without a tool call; in OpenCode and OpenHands the latter ends the run, so they "
                     "have no turns). Its next-token distribution is close to uniform whatever the prompt and the "
                     "per-sample seeds are shared, so (b) counts near-uniform draws from the vocabulary, much the "
                     "same sequences in every harness: it shows how often such sequences are non-canonical, not the "
                     "rate of a trained model.")
    return " ".join(parts)


def row(run: dict[str, Any]) -> dict[str, Any]:
    """One harness's row; a harness whose prompts exceed the context reports their length instead of rates."""
    lengths, replay = run["prompt_tokens"], run.get("replay")
    base = {"harness": run["harness"], "tokenizer": TOKENIZER_NAMES.get(run["tokenizer"], run["tokenizer"]),
            "model": model_cell(run), "rollouts": run["rollouts"], "calls": run["calls"]}
    prompt = f"{lengths['first_prompt_median'] or '-'} / {lengths['max_prompt'] or '-'} of {lengths['max_model_len']}"
    if _exceeds_context(run):
        note = (f"prompts exceed the context: {lengths['refused_max']} tokens > max_model_len "
                f"{lengths['max_model_len']} ({lengths['refused_calls']} calls refused)")
        return base | {"(a) prompt is not previous prompt + completion": note, "break causes": "-",
                       "(b) non-canonical completions": note, "invalid UTF-8": "-",
                       "(c) rebuilt loop diverges": "-", PROMPT_COLUMN: prompt}
    retok = run["retokenization"]
    return base | {
        "(a) prompt is not previous prompt + completion": share_cell(run["prefix_drift_all"], "turns") if
        run["prefix_drift_all"]["n"] else "- (0 turns: no rollout made a second call of one purpose)",
        "break causes": _causes(run["prefix_drift"]),
        "(b) non-canonical completions": share_cell(run["retokenization_all"], "completions"),
        "invalid UTF-8": str(sum(p["invalid_utf8"] for p in retok.values())),
        "(c) rebuilt loop diverges": share_cell(replay["share"], "turns") if replay else "n/a",
        PROMPT_COLUMN: prompt,
    }


def purpose_rows(run: dict[str, Any]) -> list[dict[str, Any]]:
    """Per call purpose: prefix drift (with flag disagreements) and non-canonical completions."""
    purposes = sorted(set(run["prefix_drift"]) | set(run["retokenization"]))
    rows = []
    for purpose in purposes:
        prefix, retok = run["prefix_drift"].get(purpose, {}), run["retokenization"].get(purpose, {})
        rows.append({"harness": run["harness"], "model": "SFT" if run.get("warm_start") else "random init",
                     "purpose": purpose,
                     "(a) prefix breaks": share_cell(prefix.get("share"), "turns"),
                     "retokenized / reply rewritten / history changed": "/".join(
                         str(prefix.get(c, 0)) for c in ("retokenized", "reply_rewritten", "history_changed")),
                     "not comparable": prefix.get("not_comparable", 0),
                     "store flag disagrees": prefix.get("flag_disagrees", 0),
                     "(b) non-canonical": share_cell(retok.get("share"), "completions"),
                     "sampled / canonical tokens": f"{retok.get('tokens', 0)} / {retok.get('canonical_tokens', 0)}"})
    return rows


def drift_markdown(runs: list[dict[str, Any]]) -> str:
    """The table of the newest run per harness, its per-purpose detail, how it was measured and produced."""
    chosen = newest_per_harness(runs)
    first = chosen[0]
    tasks = {"`" + str(r["task_distribution"]) + "`" for r in chosen}
    tokenizers = {TOKENIZER_NAMES.get(r["tokenizer"], r["tokenizer"]) for r in chosen}
    lines = [
        pd.DataFrame([row(r) for r in chosen]).to_markdown(index=False, disable_numparse=True), "",
        f"{_model_text(chosen)}. All on the {', '.join(sorted(tokenizers))} "
        f"tokenizer, sampled at temperature {first['temperature']} with up to {first['max_tokens']} tokens a call, "
        f"through the recording proxy and the CPU server; tasks {', '.join(sorted(tasks))}. Shares are k/n with "
        "a 95% Wilson interval. (a) turns = calls with an earlier call of the same purpose in their rollout "
        "(both with token ids); a break is a prompt that does not start with that call's prompt + sampled "
        "completion (counted from the ids). Causes: *retokenized* = history kept, the reply back as the canonical "
        "ids of its text; *reply rewritten* = history kept, the reply back as other ids (re-serialized tool "
        "calls, stripped text); *history changed* = the previous prompt is no longer a prefix (a dropped reply, "
        "re-rendered or truncated history). (b) a sampled completion (without its end-of-turn token) whose "
        "decoded text encodes to other ids; *invalid UTF-8*: of those, sequences whose bytes are not even valid "
        "UTF-8. (c) the harness's turns whose prompt the rebuilt loop does not reproduce token for token when "
        "the recording is replayed through it (mini-SWE-agent 2.x tool-call mode only). "
        + _caveats(chosen), "",
        "### Per call purpose", "",
        pd.DataFrame([r for run in chosen for r in purpose_rows(run)]).to_markdown(index=False,
                                                                                  disable_numparse=True), "",
    ]
    lines += [f"Command: `{c}`  " for c in sweep_commands(chosen)]
    sources = ", ".join(f"`{r['run_dir']}`" for r in chosen)
    lines += ["", f"Sources: {sources} · built by `repro table`."]
    return "\n".join(lines) + "\n"


def write_tokenizer_drift_tables(runs: list[dict[str, Any]], results: Path) -> list[Path]:
    """``results/<table>.md`` and ``.csv`` (one row per harness) per table name."""
    written = []
    for name, group in by_table(runs).items():
        md, csv = results / f"{name}.md", results / f"{name}.csv"
        md.write_text(f"# {name}\n\n" + drift_markdown(group) + _archived_note(results, name))
        pd.DataFrame([row(r) | {"run": run_name(r["run_dir"])} for r in newest_per_harness(group)]).to_csv(
            csv, index=False)
        written += [md, csv]
    return written


def _archived_note(results: Path, name: str) -> str:
    """A pointer to tables of this name kept verbatim from before run records (``<name>_<date>.md``: their run
    directories are gone, so ``repro table`` cannot rebuild their rows)."""
    archived = sorted(p.name for p in results.glob(f"{name}_*.md"))
    if not archived:
        return ""
    return ("\nEarlier rows, published before run records existed and kept verbatim (their runs are not in "
            f"`results/runs/`): {', '.join(f'`{a}`' for a in archived)}.\n")
