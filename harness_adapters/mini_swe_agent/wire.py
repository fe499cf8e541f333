"""What the mini-SWE-agent pool and its workers say to each other: the request for one rollout
(:func:`worker_request`) and the result read from a worker's report (:func:`result_from_worker`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from harness_adapters.mini_swe_agent.adapter import (
    CONFIG_NAMES,
    ROLLOUT_CONFIG_NAME,
    TRAJECTORY_NAME,
    litellm_model_name,
    rollout_settings,
    swebench_environment,
    write_yaml,
)
from harness_adapters.mini_swe_agent.outcome import FINISHED_EXIT_STATUSES
from harness_adapters.processes import last_line
from repro.common.venvs import HarnessEnv
from repro.protocols import HarnessResult, HarnessRollout

__all__ = ["result_from_worker", "worker_request"]

JAILED_CLASS = "repro_mswea_jailed.JailedLocalEnvironment"  # jailed.CLASS_PATH (it imports mini)


def worker_request(rollout: HarnessRollout, env: HarnessEnv, config_dir: Path,
                   jail: dict[str, Any] | None = None) -> dict[str, Any]:
    """Write the rollout's config overlay and build its request to a worker (the options ``build_command`` gives
    ``mini``); ``config_dir`` holds the harness's shared config files; ``jail``: the rollout's jail (its commands
    then run through ``jailed``, mini's local environment in that jail)."""
    workdir, output_dir = Path(rollout.workdir).resolve(), Path(rollout.output_dir).resolve()
    rollout_config = output_dir / "config" / ROLLOUT_CONFIG_NAME
    rollout_config.parent.mkdir(parents=True, exist_ok=True)
    container_base = swebench_environment(env.site_packages) if rollout.container is not None else None
    write_yaml(rollout_config, rollout_settings(rollout.task.problem_statement, rollout.base_url, workdir,
                                                rollout.container, container_base, rollout.env, jail))
    trajectory = output_dir / TRAJECTORY_NAME
    trajectory.unlink(missing_ok=True)
    shared = [config_dir / name for name in CONFIG_NAMES.values()]
    return {
        "rollout_id": rollout.rollout_id,
        "config_files": [*map(str, shared), str(rollout_config)],
        "cli": {
            "model_name": litellm_model_name(rollout.model_name),
            "environment_class": "docker" if rollout.container is not None else JAILED_CLASS if jail else "local",
            "yolo": True,
            "cost_limit": 0.0,
            "exit_immediately": True,
            "output": str(trajectory),
        },
        "workdir": "" if rollout.container is not None else str(workdir),
        "output_dir": str(output_dir),
        "timeout_s": rollout.timeout_s,
        "diff_command": rollout.container.diff_command if rollout.container is not None else None,
        "startup_command": rollout.container.startup_command if rollout.container is not None else "",
        "startup_timeout_s": rollout.container.startup_timeout_s if rollout.container is not None else None,
    }


def result_from_worker(rollout: HarnessRollout, message: dict[str, Any], pid: int) -> HarnessResult:
    """Map a worker's report to a result, classified as the subprocess adapter classifies a finished ``mini``."""
    outcome, exit_status = message.get("outcome"), str(message.get("exit_status", ""))
    trajectory = message.get("trajectory_path")
    if outcome == "timeout":
        status, reason = "timeout", f"ran past {rollout.timeout_s:g} s; stopped by the worker's watchdog"
    elif outcome == "raised":
        status = "crashed"
        reason = f"uncaught error, exit status {exit_status or 'none'}: {last_line(message.get('error', ''))}"
    elif not trajectory:
        status, reason = "crashed", "the agent returned but wrote no trajectory"
    elif exit_status not in FINISHED_EXIT_STATUSES:
        status, reason = "crashed", f"unexpected exit status {exit_status!r}"
    else:
        status, reason = "finished", exit_status
    info = {k: message.get(k) for k in ("cpu_s", "submission", "error", "diff", "diff_error")} | {
        "worker_pid": pid,
        "stdout_log": str(Path(rollout.output_dir).resolve() / "stdout.log"),
    }
    return HarnessResult(
        rollout_id=rollout.rollout_id,
        status=status,
        reason=reason,
        exit_status=exit_status,
        n_model_calls=int(message.get("n_model_calls") or 0),
        duration_s=float(message.get("duration_s") or 0.0),
        trajectory_path=trajectory,
        info=info,
    )
