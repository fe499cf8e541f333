"""The warm-start lab behind issue 30's SFT choices (docs/architecture.md, "Where a 2-core machine's time goes"):
record the default miniature's demonstrations once, train SFT variants on the same rows, evaluate each on the
validation split in the real harness. A measurement script, not a job: nothing here is published by `repro table`.

    python scripts/warm_start_lab.py demos OUT [overrides...]
    python scripts/warm_start_lab.py sft OUT DEMOS '{"batch_size": 8, "epochs": 7.5}' '{"num_layers": 2}' [overrides...]
    python scripts/warm_start_lab.py eval MODEL_DIR OUT N_TASKS K [overrides...]

``sft``'s first JSON overrides ``warm_start.sft`` (plus ``n_rows``: train on the first N rows; ``one_call_share``: keep
this share of the one-action rows, a seeded draw, and every row of several actions), the second the model
config (a changed architecture gets its own base model; the tokenizer, and so the rows, stay the same).
"""

from __future__ import annotations

import dataclasses
import json
import pickle
import random
import sys
import time
from pathlib import Path

from hydra.utils import instantiate

from repro.cli.runner import compose_config
from repro.recipe.miniature import MiniatureConfig, split_train
from repro.recipe.warm_start import WarmStartRun, demonstration_rows, record_demonstrations
from repro.rl.evaluator import Evaluator, build_spec
from repro.tasks.sets import load_task_set
from repro.tinymodel.recipe import build_recipe_model
from repro.train.sft import sft_train
from repro.train.sft_holdout import action_spans


@dataclasses.dataclass
class Row:
    input_ids: list[int]
    loss_mask: list[int]


def parts(overrides: list[str]) -> MiniatureConfig:
    """The default job's (the miniature's) setup, task sets, evaluation and warm start, instantiated (``overrides``
    as for ``repro run``)."""
    return instantiate(compose_config(overrides).job.miniature, _convert_="all")


def demos(out: Path, overrides: list[str]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    p = parts(overrides)
    _, train = load_task_set(p.train_tasks)
    demo_tasks, _ = split_train(train, p.warm_start.n_demo_tasks, p.tasks.difficulty)
    started = time.time()
    with p.setup.harness_and_sandbox(workers=2) as (agent, box):
        base = build_recipe_model(p.setup.model, agent, train, platform_line=True)
        ids = record_demonstrations(WarmStartRun(p.setup, agent, box, out), base, demo_tasks, p.warm_start)
        rows = demonstration_rows(out / "traces.sqlite", ids, p.warm_start.sample_mode)
    (out / "rows.pkl").write_bytes(pickle.dumps([(list(r.input_ids), list(r.loss_mask)) for r in rows]))
    lengths = sorted(len(r.input_ids) for r in rows)
    print(json.dumps({"rows": len(rows), "seconds": time.time() - started, "tokens_mean": sum(lengths) / len(rows),
                      "tokens_max": lengths[-1], "labelled_mean": sum(sum(r.loss_mask) for r in rows) / len(rows)}))


def keep_one_call_share(rows: list[Row], share: float, seed: int = 0) -> list[Row]:
    """Every row of several actions, and ``share`` of the one-action rows (a seeded draw, order kept)."""
    draw = random.Random(seed)
    return [r for r in rows if len(action_spans(r.loss_mask)) > 1 or draw.random() < share]


def sft(out: Path, demo_dir: Path, sft_json: str, model_json: str, overrides: list[str]) -> None:
    p = parts(overrides)
    _, train = load_task_set(p.train_tasks)
    with p.setup.harness_and_sandbox(workers=1) as (agent, _):
        base = build_recipe_model(dataclasses.replace(p.setup.model, **json.loads(model_json)), agent, train,
                                  platform_line=True)
    rows = [Row(a, b) for a, b in pickle.loads((demo_dir / "rows.pkl").read_bytes())]
    changes = json.loads(sft_json)
    rows = rows[: changes.pop("n_rows", None) or len(rows)]
    rows = keep_one_call_share(rows, changes.pop("one_call_share", 1.0))
    print("RESULT", json.dumps(sft_train(base, rows, out, dataclasses.replace(p.warm_start.sft, **changes))))


def evaluate(model_dir: Path, out: Path, n_tasks: int, k: int, overrides: list[str]) -> None:
    p = parts([*overrides, f"tasks.n_tasks={n_tasks}", f"eval.k={k}", "tasks.split=validation"])
    name, tasks = load_task_set(p.tasks)
    started = time.time()
    out.mkdir(parents=True, exist_ok=True)
    with p.setup.harness_and_sandbox(workers=2) as (agent, box):
        spec = build_spec(agent, name, tasks, p.setup.sandbox, p.eval, p.tasks.seed, p.setup.served_model_name)
        with p.setup.server(model_dir, out) as stack:
            evaluator = Evaluator(stack, agent, box, p.eval, spec=spec, store_path=out / "traces.sqlite")
            reports = evaluator.evaluate(tasks, out / "eval", "lab").reports
    resolved = sum(r.outcome == "resolved" for r in reports)
    print("EVAL", json.dumps({"model": str(model_dir), "resolved": resolved, "n": len(reports),
                              "pass1": resolved / len(reports), "seconds": time.time() - started}))


def main(argv: list[str]) -> None:
    command, *args = argv
    if command == "demos":
        demos(Path(args[0]), args[1:])
    elif command == "sft":
        sft(Path(args[0]), Path(args[1]), args[2], args[3], args[4:])
    elif command == "eval":
        evaluate(Path(args[0]), Path(args[1]), int(args[2]), int(args[3]), args[4:])
    else:
        raise SystemExit(__doc__)


if __name__ == "__main__":
    main(sys.argv[1:])
