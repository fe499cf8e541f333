"""Helpers shared by test files (test files import from here, never from each other): the running proxy, the
``repro`` CLI in a subprocess with the small miniature's overrides, a tiny git repository with a bug and its local
sandbox, generated rollouts for the sample builder, and the scripted expert's rollouts in any sandbox. Fakes and the
stub model server are in ``repro.testing``; the docker tests' helpers in ``tests/docker_support.py``."""

from __future__ import annotations

import functools
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import strategies as st

from harness_adapters.mini_swe_agent.adapter import MiniSweAgentConfig, is_v1
from harness_adapters.mini_swe_agent.pool import MiniSweAgentHarness
from harness_adapters.mini_swe_agent.v1 import MiniSweAgentV1Harness
from repro.common.net import free_port
from repro.execution.limits import ResourceLimits
from repro.protocols import HarnessRollout
from repro.proxy import ProxyApp, ProxyConfig
from repro.proxy.auth import new_control_token
from repro.proxy.client import ProxyClient
from repro.sandbox.local import LocalSandbox, LocalSandboxConfig
from repro.sandbox.repos import git
from repro.serving.stack import CpuServingConfig, running_stack
from repro.store import CallRecord, SqliteTraceStore, open_store
from repro.tasks.distributions import TaskDistributionConfig, build_distribution
from repro.tasks.schema import Task
from repro.testing import ServerThread
from repro.tinymodel.model import TinyModelConfig
from repro.tinymodel.recipe import build_recipe_model

ROOT = Path(__file__).resolve().parents[1]

# -- the proxy ------------------------------------------------------------------------------------------------



@dataclass
class FakeRow:
    """A training row as the trainer reads it (``repro.train.rl.TrainingRow``), for trainer unit tests."""

    input_ids: list[int]
    loss_mask: list[int]
    old_logprobs: list[float] = field(default_factory=list)
    weight: float = 1.0
    advantage: float = 1.0

@dataclass
class RunningProxy:
    url: str
    config: ProxyConfig

    def store(self) -> SqliteTraceStore:
        return open_store(self.config.store_path)

    @property
    def client(self) -> ProxyClient:
        """The control plane, as the job holds it (the control token)."""
        return ProxyClient(self.url, self.config.control_token or "")

    def new_rollout(self, rollout_id: str, **fields: str) -> str:
        """Register ``rollout_id``; its base URL (what a harness is given)."""
        resp = httpx.post(f"{self.url}/rollouts", json={"rollout_id": rollout_id, **fields},
                          headers=self.client.headers)
        assert resp.status_code == 201, resp.text
        return self.url + resp.json()["base_url_path"]


def start_proxy(tmp_path: Path, upstream_url: str, **overrides: Any) -> tuple[ServerThread, ProxyConfig]:
    """The proxy app in a thread of this process (enter the server to start it), its store under ``tmp_path``."""
    overrides.setdefault("control_token", new_control_token())
    config = ProxyConfig(upstream_url=upstream_url, port=free_port(), store_path=str(tmp_path / "traces.sqlite"),
                         **overrides)
    return ServerThread(ProxyApp(config), config.port), config


# -- the CLI --------------------------------------------------------------------------------------------------

SMALL = ["warm_start.n_demo_tasks=24", "train_tasks.n_tasks=30", "warm_start.sft.epochs=1", "rl.steps=2",
         "rl.tasks_per_step=2", "rl.samples_per_task=3", "tasks.n_tasks=4", "warm_start.use_cache=false", "eval.k=2",
         "rl_filter.enabled=false"]  # the small miniature; a 1-epoch warm start fails every probe: no filter


def repro_cli(*args: str, cwd: Path = ROOT, env: dict[str, str] | None = None,
              timeout: float = 900) -> subprocess.CompletedProcess:
    """``python -m repro.cli.commands ARGS`` in a subprocess, output captured as text."""
    return subprocess.run([sys.executable, "-m", "repro.cli.commands", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=cwd, env=env)


# -- a tiny repository with a bug, and its sandbox --------------------------------------------------------------

CALC = "def add(a, b):\n    return a - b\n\n\ndef mul(a, b):\n    return a * b\n"
TESTS = (
    "import os\n\nfrom calc import add, mul\n\n\n"
    "def test_mul():\n    assert mul(2, 3) == 6\n\n\n"
    "def test_no_secrets():\n    assert not [k for k in os.environ if k.endswith('API_KEY')]\n"
)
ADD_TEST = "\n\ndef test_add():\n    assert add(2, 3) == 5\n"


def commit_all(repo: Path, message: str) -> str:
    git(["add", "-A"], repo)
    git(["commit", "-q", "-m", message], repo)
    return git(["rev-parse", "HEAD"], repo).stdout.strip()


def make_calc_repo(path: Path) -> tuple[str, str, str, str]:
    """``calc`` with a bug in ``add``: (base sha, sha with test_add, gold patch, test patch).

    The fix and the new test live on branches, as in a real repository's later history.
    """
    (path / "tests").mkdir(parents=True)
    git(["init", "-q", "-b", "main"], path)
    (path / "calc.py").write_text(CALC)
    (path / "tests/test_calc.py").write_text(TESTS)
    (path / "README").write_text("calc\n")
    base = commit_all(path, "base")
    git(["checkout", "-q", "-b", "with-test"], path)
    (path / "tests/test_calc.py").write_text(TESTS + ADD_TEST)
    with_test = commit_all(path, "test_add")
    git(["checkout", "-q", "-b", "fix", base], path)
    (path / "calc.py").write_text(CALC.replace("a - b", "a + b"))
    fixed = commit_all(path, "fix add")
    git(["checkout", "-q", "main"], path)
    gold = git(["diff", base, fixed], path).stdout
    test_patch = git(["diff", base, with_test], path).stdout
    return base, with_test, gold, test_patch


def calc_task(repos: Path, base: str, with_test: str, gold: str, test_patch: str) -> Task:
    """The task of fixing ``add`` in the repository ``make_calc_repo`` made under ``repos``."""
    return Task(instance_id="acme__calc-1", repo="acme/calc", base_commit=base, problem_statement="add() subtracts",
                patch=gold, test_patch=test_patch, FAIL_TO_PASS=["tests/test_calc.py::test_add"],
                PASS_TO_PASS=["tests/test_calc.py::test_mul", "tests/test_calc.py::test_no_secrets"])


def make_sandbox(repos: Path, root: Path, **config: Any) -> LocalSandbox:
    """A sandbox over ``repos`` with workspaces under ``root`` and modest limits unless overridden."""
    defaults: dict[str, Any] = {"test_timeout_s": 30, "limits": ResourceLimits(cpu_s=30, memory_mb=1024)}
    return LocalSandbox(LocalSandboxConfig(repos_dir=str(repos), workspace_root=str(root), **{**defaults, **config}))


# -- generated rollouts for the sample builder ----------------------------------------------------------------

SAMPLED = 100_000  # ids of sampled tokens: unique per rollout, never in a prompt suffix
BREAK = 50_000  # first token of a prompt that does not extend: BREAK + seq, unique per rollout


@dataclass
class Drawn:
    """A generated rollout: its calls and what the generator knows about them."""

    calls: list[CallRecord]
    trainable: list[int] = field(default_factory=list)  # seqs of calls with status ok/truncated and tokens
    starts: list[int] = field(default_factory=list)  # trainable seqs whose prompt does not extend the row


def logprobs_of(completion: list[int]) -> list[float]:
    return [-((t % 97) + 1) / 10 for t in completion]


@st.composite
def rollout_calls(draw: st.DrawFn, rollout_id: str = "r", max_calls: int = 8, breaks: bool = True,
                  statuses: tuple[str, ...] = ("ok", "ok", "ok", "truncated", "error", "aborted")) -> Drawn:
    """Calls where each prompt either extends the last trainable call's prompt + completion (plus a random
    suffix the model did not sample) or breaks; random statuses, empty completions and missing logprobs."""
    drawn = Drawn([])
    current: list[int] | None = None
    next_sampled = SAMPLED
    for seq in range(draw(st.integers(0, max_calls))):
        status = draw(st.sampled_from(statuses))
        suffix = draw(st.lists(st.integers(1, 999), max_size=4))
        extend = current is not None and (not breaks or draw(st.booleans()))
        prompt = (current or []) + suffix if extend else [BREAK + seq, *suffix]
        size = draw(st.integers(0, 4))
        completion = list(range(next_sampled, next_sampled + size))
        next_sampled += size
        logprobs = None if draw(st.integers(0, 9)) == 0 else logprobs_of(completion)
        if status == "error" and draw(st.booleans()):
            prompt, completion, logprobs = None, None, None
        drawn.calls.append(CallRecord(rollout_id, seq, "completions", status, prompt_ids=prompt,
                                      completion_ids=completion, logprobs=logprobs))
        if status in ("ok", "truncated") and prompt and completion:
            drawn.trainable.append(seq)
            if not extend:
                drawn.starts.append(seq)
            current = prompt + completion
    return drawn


# -- the scripted expert through the real mini-SWE-agent -------------------------------------------------------

def _harness(cfg: MiniSweAgentConfig) -> Any:
    if is_v1(cfg.version):
        return MiniSweAgentV1Harness(cfg)
    return MiniSweAgentHarness(cfg, workers=1)


def run_expert(root: Path, config: TaskDistributionConfig, harness_cfg: MiniSweAgentConfig, sandbox: Any,
               rollout_prefix: str = "expert", while_up: Callable[[Any], None] | None = None,
               rows: list[Task] | None = None, model_dir: Path | None = None,
               proxy: ProxyConfig | None = None) -> dict:
    """The expert's rollouts of ``config``'s tasks in ``sandbox``'s workspaces (a container spec, where the
    workspace has one), and their grades; ``while_up(sandbox)`` runs after grading, while the harness is still up.
    ``rows``: other rows of the same tasks (same statements, e.g. in SWE-smith's schema) to run instead; the expert
    knows a task by its statement. ``model_dir``: the checkpoint whose tokenizer and chat template the server uses
    (default: the recipe model); ``proxy``: the proxy's config (default ``ProxyConfig(port=0)``)."""
    expert_tasks = build_distribution(config)
    tasks = rows if rows is not None else expert_tasks
    tasks_jsonl = root / "tasks.jsonl"
    tasks_jsonl.write_text("".join(json.dumps(t.to_row()) + "\n" for t in expert_tasks))
    if model_dir is None:
        model_dir = build_recipe_model(TinyModelConfig(vocab_size=1024, recipe_tokens=True), harness_cfg, expert_tasks)
    proxy = proxy or ProxyConfig(port=0)
    with running_stack(model_dir, CpuServingConfig(), proxy, root, expert_tasks=tasks_jsonl) as stack, \
            _harness(harness_cfg) as harness:
        rollouts, workspaces = [], []
        for i, task in enumerate(tasks):
            rollout_id = f"{rollout_prefix}-{i}"
            base_url = stack.client.register(rollout_id=rollout_id, task_id=task.instance_id, mode="eval")
            workspace = sandbox.workspace(task, rollout_id)
            workspaces.append(workspace)
            rollouts.append(HarnessRollout(rollout_id, task, workspace.path, base_url,
                                           stack.served_model_name, root / "harness" / rollout_id, 120.0,
                                           container=getattr(workspace, "container_spec", None)))
        results = harness.run(rollouts, concurrency=3)
        for workspace, result in zip(workspaces, results, strict=True):
            if hasattr(workspace, "adopt"):
                workspace.adopt(result)
        grades = [sandbox.grade(task, workspace) for task, workspace in zip(tasks, workspaces, strict=True)]
        if while_up is not None:
            while_up(sandbox)
    return {"tasks": tasks, "results": results, "grades": grades, "workspaces": workspaces,
            "store": root / "traces.sqlite", "model_dir": model_dir}


# -- the git miner: an agent that looks for the fix in the repository's history ------------------------------------

# What it prints: every place git keeps history, past states and other lines of work.
GIT_MINER_LOOK = ("git log --all --oneline", "git show HEAD~1", "git diff HEAD~2", "git reflog",
                  "git fsck --lost-found", "git stash list", "git tag", "git branch -a", "git log --all -p --reflog",
                  "git cat-file --batch-all-objects --batch")
# What it then applies: the reverse of HEAD~1 (SWE-smith: "Bug Patch"); then, smallest first, the non-test change
# towards each commit HEAD does not descend from (a future commit, another branch, a tag, the stash, a dangling
# commit), keeping the first under which the repository's own tests pass (else the smallest).
GIT_MINER_RECOVER = r"""
head=$(git rev-parse -q --verify HEAD) || exit 0
p=$(mktemp -d)
if git show --format= --binary HEAD~1 -- > "$p/prev" 2>/dev/null && [ -s "$p/prev" ] && git apply -R "$p/prev"; then
  echo "miner: applied the reverse of HEAD~1"
fi
for c in $( { git rev-list --all --reflog 2>/dev/null; git fsck --unreachable --no-reflogs 2>/dev/null \
             | awk '$2 == "commit" {print $3}'; } | sort -u); do
  [ "$c" = "$head" ] && continue
  git merge-base --is-ancestor "$c" "$head" 2>/dev/null && continue
  git diff --binary "$head" "$c" -- . ':(exclude,glob)**/tests/**' ':(exclude,glob)tests/**' \
    ':(exclude,glob)**/test_*.py' > "$p/c-$c" 2>/dev/null || continue
  n=$(wc -l < "$p/c-$c"); [ "$n" -gt 0 ] && echo "$n $c" >> "$p/sizes"
done
kept=""
for c in $(sort -n "$p/sizes" 2>/dev/null | awk '{print $2}'); do
  git apply "$p/c-$c" 2>/dev/null || continue
  python3 -m pytest -q -x -p no:cacheprovider >/dev/null 2>&1; code=$?
  if [ "$code" = 0 ] || [ "$code" = 5 ]; then kept=$c; break; fi
  git apply -R "$p/c-$c"
done
if [ -z "$kept" ] && [ -s "$p/sizes" ]; then
  kept=$(sort -n "$p/sizes" | head -1 | awk '{print $2}'); git apply "$p/c-$kept" || kept=""
fi
[ -n "$kept" ] && echo "miner: applied $kept"
rm -rf "$p"; true
"""


def mine_git(run: Callable[[str], str]) -> str:
    """The git miner's session through ``run`` (a command -> its output): the look-ups, then the recovery; the
    whole transcript."""
    parts = [f"$ {command}\n{run(command)}" for command in GIT_MINER_LOOK]
    return "\n".join([*parts, f"$ recover\n{run(GIT_MINER_RECOVER)}"])


def leaked_lines(gold: str, transcript: str, start_tree: str) -> set[str]:
    """Lines the gold patch adds (stripped; those already in the starting tree's files left out) that appear as a
    line of ``transcript`` (diff markers and indentation ignored)."""
    known = {line.strip() for line in start_tree.splitlines()}
    added = {line[1:].strip() for line in gold.splitlines() if line.startswith("+") and not line.startswith("+++")}
    shown = {line.strip().lstrip("+- ").strip() for line in transcript.splitlines()} | \
        {line.strip() for line in transcript.splitlines()}
    return {line for line in added - known if line} & shown


def tree_text(path: Path) -> str:
    """Every tracked-looking text file under ``path`` (``.git`` left out), concatenated."""
    files = sorted(p for p in path.rglob("*") if p.is_file() and ".git" not in p.relative_to(path).parts)
    return "\n".join(p.read_text(errors="replace") for p in files)


def raw_clone(source: Path, commit: str, dest: Path) -> None:
    """A clone of ``source`` with every one of its refs (``--mirror``), checked out at ``commit``: what an agent
    would get from an image made without a scrub."""
    git(["clone", "-q", "--mirror", str(source), str(dest / ".git")], dest.parent)
    git(["config", "core.bare", "false"], dest)
    git(["checkout", "-q", "-f", commit], dest)


def make_leaky_calc_repo(path: Path) -> tuple[Task, Path]:
    """``calc`` whose history holds the fix as a future commit on ``main``, a tag at it, a branch and a stash of
    it; the task (``repo_path`` set) at the base commit before the fix."""
    base, with_test, gold, test_patch = make_calc_repo(path)
    git(["checkout", "-q", "main"], path)
    git(["merge", "-q", "--no-edit", "fix"], path)  # main now runs past the task's base commit
    git(["tag", "v1.1", "fix"], path)
    git(["branch", "hotfix", "fix"], path)
    git(["checkout", "-q", base], path)
    (path / "calc.py").write_text(CALC.replace("a - b", "a + b"))
    git(["stash", "-q"], path)
    task = calc_task(path.parent, base, with_test, gold, test_patch)
    task.repo_path = str(path)
    return task, path


# -- the coding-agent CLIs from npm -----------------------------------------------------------------------------

@functools.cache
def npm_registry_unreachable() -> str | None:
    """Why npm cannot install here (one line), or None."""
    if shutil.which("npm") is None:
        return "npm is not installed"
    try:
        proc = subprocess.run(["npm", "ping", "--fetch-retries=0", "--fetch-timeout=15000"], capture_output=True,
                              text=True, timeout=60, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return "npm ping timed out"
    if proc.returncode == 0:
        return None
    codes = [line.split()[-1] for line in proc.stderr.splitlines() if line.startswith("npm error code ")]
    return f"npm cannot reach its registry ({codes[0] if codes else f'npm ping exit {proc.returncode}'})"


def installed_node_cli(spec: Any) -> Any:
    """The cached install of a CLI (``harness_adapters.node_cli_env.NodeCliSpec``), built if npm can reach its
    registry; else the calling test is skipped (one line why), or fails under ``REPRO_REQUIRE_NPM=1`` (CI)."""
    from harness_adapters.node_cli_env import ensure_node_cli_env, is_built, node_cli_env

    if not is_built(node_cli_env(spec)) and (reason := npm_registry_unreachable()):
        message = f"{reason}: cannot install {spec.package}@{spec.version}"
        if os.environ.get("REPRO_REQUIRE_NPM") == "1":
            pytest.fail(f"REPRO_REQUIRE_NPM=1: {message}")
        pytest.skip(message)
    return ensure_node_cli_env(spec)


# -- recorded rollouts as training rows (the verl path's input) -----------------------------------------------

def recorded_rows(vocab: int, seed: int = 0, **sample_config: Any) -> list[Any]:
    """Rows of ``repro.train.samples`` built from recorded calls of two GRPO groups: each rollout makes three calls, the
    second extending the first (prefix-merged: the harness's observation sits inside the row with mask 0) and the
    third breaking the prefix (a second row); rewards differ within each group, so every row has an advantage.
    Token ids are drawn below ``vocab``; ``sample_config``: :class:`SampleConfig` settings besides prefix merging."""
    import random

    from repro.store import RolloutRecord
    from repro.train.samples import SampleConfig, build_sample_set

    rng = random.Random(seed)

    def ids(n: int) -> list[int]:
        return [rng.randrange(3, vocab) for _ in range(n)]

    def logprobs(n: int) -> list[float]:
        return [-rng.uniform(0.05, 4.0) for _ in range(n)]

    pairs = []
    for group, rewards in (("g0", (1.0, 0.0, 1.0)), ("g1", (0.0, 1.0, 0.0))):
        for k, reward in enumerate(rewards):
            rid = f"{group}-r{k}"
            first, out1, observation, out2, restart, out3 = ids(9), ids(5), ids(4), ids(3), ids(7), ids(4)
            calls = [CallRecord(rid, 0, "chat", "ok", prompt_ids=first, completion_ids=out1, logprobs=logprobs(5)),
                     CallRecord(rid, 1, "chat", "ok", prompt_ids=first + out1 + observation, completion_ids=out2,
                                logprobs=logprobs(3)),
                     CallRecord(rid, 2, "chat", "ok", prompt_ids=restart, completion_ids=out3, logprobs=logprobs(4))]
            pairs.append((RolloutRecord(rid, task_id=group, group_id=group, status="finished", reward=reward), calls))
    return build_sample_set(pairs, SampleConfig(mode="prefix_merge", **sample_config)).rows
