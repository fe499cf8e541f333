"""A minimal coding agent in the standard library: the README's example of ``harness=command``.

It asks an OpenAI-compatible chat endpoint for the next step, runs the bash commands the model calls in the current
directory (the task's working copy), sends back their output, and stops when the model answers without a tool call
or after ``--max-steps``. Under ``repro`` the endpoint is the recording proxy, so every call is stored with the token
ids the model server sampled; run alone, point ``--base-url`` at any server.

    python examples/minimal_agent.py --task-file TASK.txt --base-url http://127.0.0.1:8000/v1 --model NAME
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import urllib.request

SYSTEM = ("You are a coding agent working in a git repository (the current directory). Fix the issue you are "
          "given. Run shell commands with the bash tool; when the fix is done, answer without a tool call.")
BASH = {"type": "function", "function": {
    "name": "bash", "description": "Run a shell command in the repository and return its output",
    "parameters": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}}


def next_message(base_url: str, model: str, messages: list[dict], max_tokens: int) -> dict:
    """One chat completion: the assistant message the model sampled."""
    body = json.dumps({"model": model, "messages": messages, "tools": [BASH], "max_tokens": max_tokens}).encode()
    headers = {"content-type": "application/json", "authorization": f"Bearer {os.environ.get('OPENAI_API_KEY', '-')}"}
    request = urllib.request.Request(f"{base_url.rstrip('/')}/chat/completions", body, headers)
    with urllib.request.urlopen(request, timeout=600) as response:
        return json.load(response)["choices"][0]["message"]


def run_bash(arguments: str) -> str:
    """The output of the command a tool call names (or why it could not run)."""
    try:
        command = json.loads(arguments)["command"]
    except (json.JSONDecodeError, KeyError, TypeError):
        return "error: the arguments must be a JSON object with a 'command' string"
    try:
        proc = subprocess.run(command, shell=True, capture_output=True, text=True, timeout=60)
    except subprocess.TimeoutExpired:
        return "error: the command ran past 60 s and was stopped"
    return f"{(proc.stdout + proc.stderr)[-4000:]}\n[exit code {proc.returncode}]"


def solve(task: str, base_url: str, model: str, max_steps: int, max_tokens: int) -> int:
    """The agent loop; returns the number of steps it took."""
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": task}]
    for step in range(1, max_steps + 1):
        message = next_message(base_url, model, messages, max_tokens)
        calls = message.get("tool_calls") or []
        messages.append({"role": "assistant", "content": message.get("content") or "",
                         **({"tool_calls": calls} if calls else {})})
        if not calls:
            return step
        for call in calls:
            output = run_bash(call["function"].get("arguments") or "")
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": output})
    return max_steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--task-file", required=True)
    parser.add_argument("--base-url", default=os.environ.get("OPENAI_BASE_URL", "http://127.0.0.1:8000/v1"))
    parser.add_argument("--model", default=os.environ.get("REPRO_MODEL", "default"))
    parser.add_argument("--max-steps", type=int, default=10)
    parser.add_argument("--max-tokens", type=int, default=512)
    args = parser.parse_args()
    with open(args.task_file, encoding="utf-8") as f:
        task = f.read()
    steps = solve(task, args.base_url, args.model, args.max_steps, args.max_tokens)
    print(json.dumps({"steps": steps}))


if __name__ == "__main__":
    main()
