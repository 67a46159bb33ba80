"""Downstream evaluation: lm-evaluation-harness tasks on a model this tool has already loaded, wrapped
in lm-eval's ``HFLM`` and run through ``simple_evaluate``, so every figure is lm-eval's own. lm-eval
is an optional dependency, imported only here. Tasks are looked up in the shipped offline tasks, the
user's ``--include-path`` and, only when a name is in neither, lm-eval's own task list (indexing its
thousands of YAML files takes seconds).
"""

import copy
import importlib.util
import logging
from contextlib import contextmanager
from pathlib import Path

import yaml

from ..errors import MixLNError
from ..schema import BATCH
from .options import LIMIT, EvalOptions
from .result import TaskScore

# what installs it: lm-eval from PyPI (mixln-convert itself is not on PyPI, so its [eval] extra installs only from a
# checkout: pip install -e '.[eval]'); the bound is pyproject.toml's
INSTALL = "pip install 'lm_eval>=0.4.13' (or, in a mixln-convert checkout, pip install -e '.[eval]')"


def known_tasks(options):
    """The lm-eval TaskManager that knows the tasks of ``options`` (an EvalOptions or AnalyzeOptions), lm-eval
    installed: a one-line error naming the flag otherwise, before any model loads (torch-free: the CLI asks first)."""
    if importlib.util.find_spec("lm_eval") is None:
        raise MixLNError(f"{options.flag('tasks')}: lm-evaluation-harness is not installed; {INSTALL}")
    return task_manager(list(options.tasks), options.include_path, options.flag("tasks"))


def task_manager(names: list[str], include_path=None, flag: str = EvalOptions.flag("tasks")):
    """An lm-eval ``TaskManager`` that knows every name in ``names``, or a MixLNError naming the unknown ones."""
    from lm_eval.tasks import TaskManager

    from .tasks import SHIPPED_TASKS, shipped_tasks_dir

    paths = [str(shipped_tasks_dir()), *([str(include_path)] if include_path else [])]
    with _quiet():
        manager = TaskManager(include_path=paths, include_defaults=False)
        if not set(names) <= set(manager.all_tasks):
            manager = TaskManager(include_path=paths)
    unknown = [name for name in names if name not in manager.all_tasks]
    if unknown and include_path:
        _check_task_files(include_path)
    if unknown:
        raise MixLNError(f"{flag}: unknown task {', '.join(unknown)} (shipped: {', '.join(SHIPPED_TASKS)}; "
                         f"lm-eval's own: `lm_eval ls tasks`; your own YAML: {EvalOptions.flag('include_path')} DIR)")
    return manager


class _TaskLoader(yaml.SafeLoader):
    """YAML as lm-eval reads a task file, its tags (``!function``) left unresolved."""


_TaskLoader.add_multi_constructor("!", lambda loader, tag, node: None)


def _check_task_files(folder) -> None:
    """lm-eval skips a task file it cannot parse without a word, and its tasks are then merely
    unknown: name the file instead."""
    for path in sorted(p for p in Path(folder).rglob("*") if p.suffix in (".yaml", ".yml") and p.is_file()):
        try:
            parsed = yaml.load(path.read_text(), Loader=_TaskLoader)  # noqa: S506 (a safe loader)
            why = None if isinstance(parsed, dict) else f"a {type(parsed).__name__}, not a mapping of keys"
        except (OSError, UnicodeDecodeError, yaml.YAMLError) as e:
            why = " ".join(str(e).split())[:200]
        if why:
            raise MixLNError(f"{EvalOptions.flag('include_path')}: {path}: malformed YAML ({why}); lm-eval skips such "
                             "a file, so the tasks it defines are unknown")


@contextmanager
def _quiet():
    """lm-eval logs every step at INFO and warns that a model object, not a name, was passed:
    only errors are shown."""
    logger = logging.getLogger("lm_eval")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


def hf_lm(model, tokenizer, batch_size: int, lm_class=None):
    """lm-eval's ``HFLM`` (or its subclass ``lm_class``) on the in-memory ``model``. HFLM sets a padding token
    on the tokenizer it is given, so it gets a copy: the checkpoint's cached tokenizer stays as loaded."""
    from lm_eval.models.huggingface import HFLM

    with _quiet():
        return (lm_class or HFLM)(pretrained=model, tokenizer=copy.deepcopy(tokenizer), batch_size=batch_size)


def run_tasks(lm, names: list[str], manager, limit: int | None = None,
              bootstrap_iters: int = 100_000) -> dict[str, TaskScore]:
    """lm-eval's ``simple_evaluate`` of ``lm`` on ``names``, reshaped: {task: its :class:`TaskScore`}.
    ``bootstrap_iters`` as lm-eval's (0: no standard errors)."""
    from unittest import mock

    from lm_eval import evaluator

    # simple_evaluate adds the folder's git hash (running `git`, which prints "fatal: not a git repository"
    # outside one) and an environment report (pip and nvidia-smi subprocesses): this tool reports neither.
    with _quiet(), mock.patch.multiple(evaluator, get_git_commit_hash=lambda: None, add_env_info=lambda storage: None):
        raw = evaluator.simple_evaluate(model=lm, tasks=names, task_manager=manager, limit=limit, log_samples=False,
                                        bootstrap_iters=bootstrap_iters)
    results = {}
    for task, values in raw["results"].items():
        if task not in raw.get("n-samples", {}):
            continue  # a group's aggregate row; its tasks have their own
        metrics = {key.split(",")[0]: value for key, value in values.items()
                   if "," in key and "_stderr," not in key and isinstance(value, (int, float))}
        stderr = {name: values.get(f"{name}_stderr,none") for name in metrics}
        results[task] = TaskScore(
            metrics=metrics,
            stderr={name: value if isinstance(value, (int, float)) else None for name, value in stderr.items()},
            higher_is_better={name: bool(raw["higher_is_better"][task].get(name, True)) for name in metrics},
            samples=raw["n-samples"][task]["effective"],
            output_type=raw["configs"][task]["output_type"],
        )
    return results


def evaluate_tasks(model, tokenizer, names: list[str], manager, *, limit: int | None = None,
                   batch_size: int = 1) -> dict:
    """lm-eval's figures of ``model`` on the tasks ``names`` (known to ``manager``, see
    :func:`task_manager`): {"tasks": run_tasks(...), "limit", "lm_eval_version"}."""
    from importlib.metadata import version

    if limit is not None:
        LIMIT.check(EvalOptions.flag("limit"), limit)
    BATCH.check(EvalOptions.flag("batch_size"), batch_size)
    return {"tasks": run_tasks(hf_lm(model, tokenizer, batch_size), names, manager, limit), "limit": limit,
            "lm_eval_version": version("lm_eval")}


def primary_metric(task_result: TaskScore) -> str:
    """The metric a task is judged by: the first its YAML lists (acc, word_perplexity, ...)."""
    return next(iter(task_result.metrics))


def format_task_table(tasks: dict[str, TaskScore]) -> list[str]:
    """Lines of a task x metric table, standard errors where lm-eval gives them."""
    rows = [("task", "metric", "value", "stderr", "n")]
    for task, result in tasks.items():
        for name, value in result.metrics.items():
            stderr = result.stderr[name]
            arrow = "↑" if result.higher_is_better[name] else "↓"
            shown = f"{value:.4f}" if abs(value) < 1e5 else f"{value:.4e}"
            rows.append((task, f"{name} {arrow}", shown, "—" if stderr is None else f"±{stderr:.4f}",
                         str(result.samples)))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return ["  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip() for row in rows]
