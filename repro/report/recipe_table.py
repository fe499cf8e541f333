"""``docs/recipe.md``: Agent Lightning's SWE recipe beside ``experiment=agl_swebench_qwen35_9b``, value by value.

Each :class:`Setting` names Agent Lightning's value, where it is written (file:line at the commits read), and the
composed config's key. The table is rendered from the composed experiment, so a changed value shows at once; a
test regenerates it and compares with the committed file. A value that differs must say why (:class:`Setting`
``why``); one that matches must not carry a stale reason. Settings without a config key (the agent loop, the git
guard) state the package's side in words and say whether it is the same.

``python -m repro.report.recipe_table [OUT]`` writes the table (default ``docs/recipe.md``).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf

AGL_COMMIT = "c632d8dd804103bd421c65208bc501952689039f"
VERL_COMMIT = "b178a3cd56f58b2d502255daba591e92833930a7"
RECIPE = ["experiment=agl_swebench_qwen35_9b", "eval.checkpoint=QWEN35_9B_DIR",
          "train_tasks.source=TRAIN.jsonl", "val_tasks.source=VAL.jsonl"]
OUT = Path("docs/recipe.md")
SAME = "same"

# Short names of the files read -> (repository, path in it).
FILES = {
    "train": ("agl", "examples/swe_smith/train_smith_agent.py"),
    "job": ("agl", "examples/swe_smith/job-template-openai.yaml"),
    "agent": ("agl", "examples/swe_smith/agents/smith_agent.py"),
    "aglcfg": ("agl", "agentlightning/verl/config.yaml"),
    "agltrain": ("agl", "agentlightning/verl/trainer.py"),
    "adapter": ("agl", "agentlightning/verl/rollout_adapter.py"),
    "doc": ("agl", "docs/75-example-coding-agent.md"),
    "actor": ("verl", "verl/trainer/config/actor/actor.yaml"),
    "optim": ("verl", "verl/trainer/config/optim/fsdp.yaml"),
    "data": ("verl", "verl/trainer/config/data/legacy_data.yaml"),
    "algos": ("verl", "verl/trainer/ppo/core_algos.py"),
    "perloss": ("agl", "agentlightning/verl/per_rollout_loss.py"),
    "jinja": ("agl", "examples/swe_smith/swe_smith_chat_template.jinja"),
}
REPOS = {"agl": ("microsoft/agent-lightning", AGL_COMMIT), "verl": ("volcengine/verl", VERL_COMMIT)}


@dataclass(frozen=True)
class Setting:
    """One row: ``source`` is ``"file:line"`` or ``"file:first-last"`` with ``file`` a key of :data:`FILES`
    (several joined by ``", "``); ``key`` the composed config's dotted key, or None with ``ours`` in words."""

    group: str
    name: str
    agl: str  # Agent Lightning's value, as written there
    source: str
    key: str | None = None
    value: Any = None  # Agent Lightning's value in this package's terms (compared with the key's)
    ours: str = ""  # the package's side, when there is no key
    why: str = ""  # why the package differs ("" when it does not)
    note: str = ""  # how a matching value is reached, where the mechanism differs


S = Setting
SETTINGS: tuple[Setting, ...] = (
    S("data", "training tasks", "~6,000 SWE-smith tasks (~5k mixed + ~1k all-fail of 4 probes)", "doc:36-41",
      ours="`train_tasks.source`: the `experiment=data_pipeline` output (the same four-probe filter)"),
    S("data", "validation tasks", "400", "doc:41", "validation.n_tasks", 400),
    S("data", "test set", "(not part of the training script)", "doc:41",
      ours="`tasks.source=princeton-nlp/SWE-bench_Verified`, evaluated before and after RL"),
    S("model", "base model", "Qwen/Qwen3.5-9B", "train:18", ours="`eval.checkpoint`: a local Qwen3.5-9B directory"),
    S("model", "max model length", "81,920", "train:80", "serving.max_model_len", 81920),
    S("model", "thinking", "off (`enable_thinking: False` on every call)", "agent:829",
      "rl.extra_sampling.chat_template_kwargs.enable_thinking", False),
    S("model", "chat template", "swe_smith_chat_template.jinja: keeps `<think>\\n\\n</think>\\n\\n` in past turns",
      "train:87, jinja:29-31",
      ours="the checkpoint's own template (the tiny model's `model.chat_template=keep_think` is the same change; "
           "for a released checkpoint pass vLLM's `--chat-template` in `serving.extra_args`)",
      why="mini-SWE-agent's prompts are rendered by the served template; a prefix break there splits a rollout "
          "into rows (`samples.mode=prefix_merge`), it does not change the rewards"),
    S("model", "tool-call parser", "hermes", "train:86", "serving.tool_call_parser", "hermes",
      why="Qwen3.5 writes `<tool_call><function=...>` XML calls (vLLM's qwen3_coder); Agent Lightning's agent "
          "reads one bash block from the text, so its parser is not used"),
    S("agent", "agent loop", "its own text-mode loop: one bash block per turn", "agent:216-231",
      ours="the unchanged mini-SWE-agent 2.4.6 (tool calls), `harness=mini_swe_agent`",
      why="the package's premise: train in the harness that ships"),
    S("agent", "turns", "100", "job:24-25", "harness.step_limit", 100),
    S("agent", "rollout timeout (s)", "5,400", "train:145", "harness.wall_time_limit_s", 5400),
    S("agent", "command timeout (s)", "120", "agent:861", "harness.command_timeout_s", 120),
    S("agent", "command timeout in the container (s)", "120", "agent:861", "sandbox.command_timeout_s", 120),
    S("agent", "tokens per call", "12,288", "job:41-42", "rl.max_tokens", 12288),
    S("agent", "observation cap", "6,000 characters, head + tail", "job:43-44, agent:234-247",
      ours="mini-SWE-agent's own observation template (10,000 characters, head + tail)",
      why="the harness is not edited; `harness.config_file` can set another template"),
    S("agent", "git", ".git moved out of the tree, git commands refused", "agent:26-29, agent:42-46",
      "sandbox.scrub_history", True,
      note="git still works, on one root commit of the start state: no other history, refs, reflog, remotes or "
           "objects (`repro.sandbox.history`); a git-mining agent recovers nothing "
           "(tests/docker/test_docker_git_leak.py)"),
    S("agent", "network", "refused by a command filter and an egress policy", "agent:48-50",
      "sandbox.limits.network", "none"),
    S("agent", "pip and test-file edits", "refused by the command filter", "agent:254-295",
      ours="not refused", why="grading runs in a fresh container that restores the test files"),
    S("reward", "tests rewarded", "FAIL_TO_PASS + PASS_TO_PASS of the same files", "agent:593-597",
      "rl.reward.tests", "same_file"),
    S("reward", "test runner", "`pytest -rA -n4` on those tests", "agent:601-606",
      ours="the task's eval script (SWE-bench's), statuses parsed by swebench",
      why="one grader for reward and Pass@1"),
    S("reward", "test timeout (s)", "600", "agent:862", "sandbox.test_timeout_s", 600.0),
    S("reward", "turn penalty", "0.1", "job:30-31", "rl.reward.turn_penalty", 0.1),
    S("reward", "turn penalty from turn", "80", "job:28-29", "rl.reward.turn_penalty_from", 80),
    S("reward", "turn penalty full at", "max turns, 100", "agent:657-678", "rl.reward.max_turns", 100),
    S("reward", "prompt penalty", "0.1", "job:39-40", "rl.reward.prompt_penalty", 0.1),
    S("reward", "prompt penalty from (tokens)", "50,000", "job:35-36", "rl.reward.prompt_penalty_from", 50000),
    S("reward", "prompt penalty full at (tokens)", "64,000", "job:37-38", "rl.reward.prompt_penalty_to", 64000),
    S("reward", "penalties apply to", "solved training rollouts only", "agent:673, agent:706",
      ours="solved rollouts only (`repro.train.reward.shaped_reward`; RL rollouts are the training ones)"),
    S("schedule", "tasks per step", "16", "train:66", "rl.tasks_per_step", 16),
    S("schedule", "samples per task (GRPO n)", "8", "train:75", "rl.samples_per_task", 8),
    S("schedule", "training temperature", "1", "train:93", "rl.temperature", 1.0),
    S("schedule", "epochs", "4", "train:139", "rl.epochs", 4),
    S("schedule", "steps (cap)", "1,000", "train:140", "rl.steps", 1000),
    S("schedule", "new task order every epoch", "yes (verl's sampler)", "data:62", "rl.reshuffle_each_epoch", True),
    S("schedule", "validation every (steps)", "16", "train:137", "validation.every_steps", 16),
    S("schedule", "validation before training", "yes", "train:130", "validation.before_first_step", True),
    S("schedule", "validation temperature", "0.7", "train:94", "validation.temperature", 0.7),
    S("schedule", "test temperature", "0.7", "train:94", "eval.temperature", 0.7,
      note="the validation temperature; the training script has no test evaluation"),
    S("schedule", "checkpoint every (steps)", "16", "train:138", "rl.checkpoint_every", 16),
    S("rows", "calls -> rows", "trajectory aggregation (prompt-prefix merge)", "train:149", "samples.mode",
      "prefix_merge"),
    S("rows", "max prompt tokens (longer: dropped)", "65,536", "train:150, adapter:256-260",
      "samples.max_prompt_tokens", 65536),
    S("rows", "max response tokens (cut)", "65,536", "train:151, adapter:262-268", "samples.max_response_tokens",
      65536),
    S("rows", "reward of a rollout without one", "0.0 (`reward_fillna_value`)", "train:146, adapter:100",
      "samples.failed_reward", 0.0),
    S("advantage", "estimator", "GRPO, scaled by the group std", "train:62", "samples.scale_rewards", "group"),
    S("advantage", "std", "torch.std (sample std, ddof 1)", "algos:320", "samples.std_ddof", 1),
    S("advantage", "epsilon", "1e-6", "algos:271", "samples.eps", 1e-6),
    S("advantage", "level", "one advantage per rollout, shared by its rows", "aglcfg:10", "trainer.weighting",
      "rollout"),
    S("advantage", "computed", "after the rows are trimmed", "agltrain:594-606",
      ours="before the plan trims rows (`repro.samples`)",
      why="trimming drops same-reward groups first, whose advantages are 0 either way; only a random drop from a "
          "mixed group (when too few same-reward rows remain) would change that group's statistics upstream"),
    S("update", "loss normaliser", "`per_rollout_mean`: a row's tokens over its rollout's tokens x the step's rows",
      "aglcfg:39, perloss:16-41", ours="a rollout's per-token mean (row weights), over the planned rollouts",
      why="a factor per step (rows / rollouts); here a rollout counts once however many rows its prefix breaks "
          "made"),
    S("update", "learning rate", "1e-6", "train:103", "trainer.learning_rate", 1e-6),
    S("update", "schedule", "constant, no warm-up", "optim:15, optim:39",
      ours="constant (the RL trainer has no scheduler)"),
    S("update", "weight decay", "0.01", "optim:21", "trainer.weight_decay", 0.01),
    S("update", "Adam betas", "(0.9, 0.999)", "optim:27", "trainer.adam_betas", [0.9, 0.999]),
    S("update", "gradient clip", "1.0", "optim:30", "trainer.max_grad_norm", 1.0),
    S("update", "clip low", "0.2", "train:107", "trainer.clip_low", 0.2),
    S("update", "clip high", "0.28", "train:108", "trainer.clip_high", 0.28),
    S("update", "dual-clip c", "3.0", "actor:79", "trainer.clip_ratio_c", 3.0),
    S("update", "KL term, entropy bonus", "none, 0", "train:104-106",
      ours="none (the objective has neither)"),
    S("update", "PPO mini-batch (rows)", "16 tasks x n 8 = 128", "train:100, train:75, agltrain:499",
      "trainer.ppo_mini_batch_rows", 128),
    S("update", "updates per step (cap)", "2; rows trimmed to a multiple of 128, same-reward groups first",
      "train:147, agltrain:499-534", "trainer.max_ppo_updates", 2),
    S("update", "old logprobs", "recomputed by the trainer", "agltrain:558-563", "trainer.old_logprobs",
      "recompute"),
)


def source_links(source: str) -> str:
    """``train:100, job:24-25`` -> markdown links to those lines at the commits read."""
    links = []
    for part in source.split(", "):
        name, lines = part.split(":")
        repo_key, path = FILES[name]
        repo, commit = REPOS[repo_key]
        first, _, last = lines.partition("-")
        anchor = f"#L{first}" + (f"-L{last}" if last else "")
        links.append(f"[{Path(path).name}:{lines}](https://github.com/{repo}/blob/{commit}/{path}{anchor})")
    return ", ".join(links)


def plain(value: Any) -> Any:
    """A composed value as plain python (lists for list nodes)."""
    if isinstance(value, ListConfig | DictConfig):
        return OmegaConf.to_container(value, resolve=True)
    return value


def package_side(setting: Setting, cfg: DictConfig) -> tuple[str, str]:
    """(the package's side, same or why not) for one row; raises when a difference is not explained or a reason
    is stale."""
    if setting.key is None:
        return setting.ours, setting.why or SAME
    missing = object()
    ours = OmegaConf.select(cfg, setting.key, default=missing)
    if ours is missing:
        raise KeyError(f"recipe table: {setting.name!r} names {setting.key}, which the composed recipe lacks")
    ours = plain(ours)
    numeric = isinstance(ours, int | float) and not isinstance(ours, bool)
    same = ours == setting.value and (type(ours) is type(setting.value) or numeric)
    if same and setting.why:
        raise ValueError(f"recipe table: {setting.key} = {ours!r} matches Agent Lightning, but the row gives a "
                         f"reason it differs ({setting.why!r}): drop the reason")
    if not same and not setting.why:
        raise ValueError(f"recipe table: {setting.key} = {ours!r} differs from Agent Lightning's "
                         f"{setting.value!r} ({setting.source}) and the row does not say why")
    verdict = setting.why or (f"{SAME}: {setting.note}" if setting.note else SAME)
    return f"`{setting.key}` = `{ours!r}`", verdict


def render(cfg: DictConfig) -> str:
    """The markdown of ``docs/recipe.md`` for the composed recipe ``cfg``."""
    lines = [
        "# The reproduction recipe beside Agent Lightning's",
        "",
        "Generated by `python -m repro.report.recipe_table` from the composed `experiment=agl_swebench_qwen35_9b`; "
        "`tests/unit/test_recipe_table.py` fails when the config and this file disagree. Agent Lightning's values "
        f"were read at microsoft/agent-lightning@{AGL_COMMIT[:8]} (`examples/swe_smith/`, `agentlightning/verl/`) "
        f"and, where it does not override them, verl's defaults at volcengine/verl@{VERL_COMMIT[:9]}.",
        "",
        "| | parameter | Agent Lightning | source | this package | same, or why not |",
        "|---|---|---|---|---|---|",
    ]
    differ = 0
    for setting in SETTINGS:
        ours, verdict = package_side(setting, cfg)
        differ += not verdict.startswith(SAME)
        lines.append(f"| {setting.group} | {setting.name} | {setting.agl} | {source_links(setting.source)} | "
                     f"{ours} | {verdict} |")
    lines += ["", f"{len(SETTINGS)} settings, {differ} differ (each says why).", ""]
    return "\n".join(lines)


def composed_recipe() -> DictConfig:
    from repro.compose import compose_config  # here: Hydra's composition is only needed when rendering

    return compose_config(RECIPE)


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    out = Path(args[0]) if args else OUT
    out.write_text(render(composed_recipe()))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
