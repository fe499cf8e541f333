"""mini-SWE-agent 1.x acting inside a task container, the way its own SWE-bench runner does it.

Runs with the pinned 1.x environment's Python (it imports only ``minisweagent`` and the standard library), one
process per rollout: ``python v1_docker.py REQUEST_JSON``. Its ``mini`` command has no
environment-class option (always ``LocalEnvironment``), so this follows ``minisweagent.run.extra.swebench_single``
instead, with the instance given as JSON rather than loaded from a hub dataset:

1. what that runner's ``get_sb_environment(config, instance)`` does, step for step (its module imports
   ``datasets`` at import time for the dataset loader, which the pinned 1.x environment does not carry): mini's
   ``get_environment`` builds its ``DockerEnvironment`` from the config's ``environment`` block with the image
   ``instance["image_name"]``, then ``run.env_startup_command`` runs through ``env.execute`` (bounded by
   ``run.env_startup_timeout`` when set: this file's addition), a failure raising;
2. ``InteractiveAgent(get_model(model_name, config["model"]), env, mode="yolo", **config["agent"])`` with
   ``confirm_exit`` off (``--exit-immediately``) runs ``instance["problem_statement"]``;
3. ``save_traj`` writes the trajectory, as both of mini's runners do;
4. then (this file's additions) ``diff_command`` runs through ``env.execute`` and its output is written to
   ``diff_path`` (an error to ``diff_path + ".error"``); ``env.cleanup()`` stops the container in the background,
   and a ``docker rm -f`` waits for its removal (the caller ends this process's group, background jobs included).

REQUEST_JSON: ``{"config": path, "instance": {...}, "model_name": str, "output": trajectory path,
"diff_command": str, "diff_path": path}``.
"""

from __future__ import annotations

import json
import subprocess
import sys
import traceback
from pathlib import Path
from typing import Any


def take_diff(env: Any, command: str, diff_path: Path) -> None:
    """The rollout's patch, printed inside the container; any failure is written beside it, never raised."""
    try:
        output = env.execute(command)
        if output.get("returncode") == 0:
            diff_path.write_text(output.get("output", ""), encoding="utf-8")
        else:
            error = f"exit {output.get('returncode')}: {str(output.get('output', ''))[-500:]}"
            Path(f"{diff_path}.error").write_text(error, encoding="utf-8")
    except BaseException as exc:
        Path(f"{diff_path}.error").write_text(f"{type(exc).__name__}: {exc}"[-500:], encoding="utf-8")


def main(request_path: str) -> None:
    import yaml
    from minisweagent.agents.interactive import InteractiveAgent
    from minisweagent.environments import get_environment
    from minisweagent.models import get_model
    from minisweagent.run.utils.save import save_traj

    request = json.loads(Path(request_path).read_text(encoding="utf-8"))
    config = yaml.safe_load(Path(request["config"]).read_text(encoding="utf-8"))
    config.setdefault("agent", {})["confirm_exit"] = False
    instance = request["instance"]
    env = agent = None
    exit_status, result, extra_info = None, None, None
    try:
        env = get_environment({**config["environment"], "image": instance["image_name"]})
        if startup := config.get("run", {}).get("env_startup_command"):
            output = env.execute(startup, timeout=config["run"].get("env_startup_timeout"))
            if output["returncode"] != 0:
                raise RuntimeError(f"Error executing startup command: {output}")
        agent = InteractiveAgent(get_model(request["model_name"], config.get("model", {})), env,
                                 **({"mode": "yolo"} | config.get("agent", {})))
        exit_status, result = agent.run(instance["problem_statement"])
    except Exception as exc:
        exit_status, result = type(exc).__name__, str(exc)
        extra_info = {"traceback": traceback.format_exc()}
    finally:
        save_traj(agent, Path(request["output"]), exit_status=exit_status, result=result, extra_info=extra_info)
        if env is not None:
            take_diff(env, request["diff_command"], Path(request["diff_path"]))
            env.cleanup()
            if getattr(env, "container_id", None):
                subprocess.run([env.config.executable, "rm", "-f", env.container_id], capture_output=True,
                               timeout=120, check=False)


if __name__ == "__main__":
    main(sys.argv[1])
