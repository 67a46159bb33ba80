"""One schema: each setting's kind gives its click option's type, the API's check and the recipe's,
so a value outside a range is refused the same way wherever it enters, naming the flag or key."""

import dataclasses
import re

import click
import pytest

from mixln_convert import options, schema
from mixln_convert.analysis import options as analysis
from mixln_convert.conversion import options as conversion
from mixln_convert.data import options as data
from mixln_convert.errors import MixLNError
from mixln_convert.evaluation import options as evaluation
from mixln_convert.export import options as export
from mixln_convert.healing import options as healing
from mixln_convert.schema import Count, Number, declared, flag
from mixln_convert.surgery import options as surgery
from mixln_convert.training import options as training
from mixln_convert.workflows import options as workflows

OPTIONS = [cls for module in (options, analysis, conversion, data, evaluation, export, healing, surgery, training,
                              workflows) for cls in vars(module).values()
           if isinstance(cls, type) and issubclass(cls, options.Options) and dataclasses.is_dataclass(cls)
           and cls.__module__ == module.__name__]


def _outside(kind):
    """A value just past the kind's range, and one of the wrong type."""
    if isinstance(kind, Count):
        return [kind.high + 1, kind.low - 1, 2.5, True]
    if isinstance(kind, Number):
        return [float("nan"), *([kind.high + 1] if kind.high is not None else []),
                *([kind.low - 1] if kind.low is not None else [])]
    return []


SETTINGS = [(cls, name) for cls in OPTIONS for name, (_, found) in declared(cls).items() if _outside(found.kind)]


@pytest.mark.parametrize("cls, name", SETTINGS, ids=[f"{cls.__name__}.{name}" for cls, name in SETTINGS])
def test_a_value_outside_a_settings_range_is_refused_naming_its_flag(cls, name):
    f, found = declared(cls)[name]
    for value in _outside(found.kind):
        with pytest.raises(MixLNError, match=rf"^{flag(f)}: "):
            cls(**{name: value})


@pytest.mark.parametrize("cls", OPTIONS, ids=lambda cls: cls.__name__)
def test_the_defaults_pass_their_own_checks(cls):
    # prune: --layers or --remove, no default; export: --to is required
    cls(**{surgery.PruneOptions: {"remove": 1}, export.ExportOptions: {"to": "llama"}}.get(cls, {}))


def test_a_click_range_is_the_kinds():
    """The option's range in --help is the one an options class checks (of those declaring the flag)."""
    from mixln_convert.cli import main

    for command in main.commands.values():
        for param in command.params:
            if isinstance(param.type, click.IntRange):
                kinds = [found.kind for cls in OPTIONS for name, (f, found) in declared(cls).items()
                         if flag(f) in param.opts and isinstance(found.kind, Count)]
                assert any((k.low, k.high) == (param.type.min, param.type.max) for k in kinds), param.opts


def test_a_setting_the_heal_command_and_a_recipe_share_is_declared_once():
    from mixln_convert.training.recipe import Heal

    for name in ("seq_len", "batch_size", "lr", "loss", "spike_factor", "activation_checkpointing"):
        assert declared(Heal)[name][1] is declared(healing.HealOptions)[name][1]
    heal_budget = [declared(cls)["heal_tokens"][1] for cls in (workflows.DemoOptions, workflows.SweepOptions,
                                                               conversion.ConvertHealOptions)]
    assert all(found == declared(Heal)["tokens"][1] for found in heal_budget)


@pytest.mark.parametrize("key, value, message", [
    ("heal.lr", "0", "heal.lr: must be a number > 0, got 0.0"),
    ("heal.batch_size", "65537", "heal.batch_size: must be an integer in [1, 65536], got 65537"),
    ("data.num_proc", "-1", "data.num_proc: must be an integer in [0, 10^13], got -1"),
    ("conversion.alpha", "1.5", "conversion.alpha: must be in [0, 1], got 1.5"),
    ("heal.tokens", "100", "heal.tokens: 100 is less than one heal step (4 x 256 = 1024 tokens)"),
])
def test_a_recipe_key_is_checked_by_the_same_kind_as_its_flag(key, value, message, tiny_llama):
    from mixln_convert.training import load_recipe

    with pytest.raises(MixLNError, match="^" + re.escape(f"--set {key}={value}: {message}")):
        load_recipe("smollm2-135m-cpu", [f"source={tiny_llama}", f"{key}={value}"])


def test_the_cpu_recipes_step_is_the_one_demo_and_sweep_count_in(tiny_llama):
    from mixln_convert.training import load_recipe

    recipe = load_recipe(workflows.CPU_RECIPE, [f"source={tiny_llama}"])
    assert recipe.global_batch_size * recipe.seq_len == workflows.CPU_STEP_TOKENS
    assert workflows.DemoOptions.train_tokens % workflows.CPU_STEP_TOKENS == 0
    # the demo's heal budget and lr are the recipe's, written there once
    assert (workflows.DemoOptions.heal_tokens, recipe.optim.lr) == (recipe.heal.tokens, healing.HEAL_LR)


def test_a_window_past_the_models_positions_is_refused_naming_its_setting():
    """One kind (schema.Window) for every seq_len a model must fit: the error names the flag, or the recipe key."""
    from mixln_convert.training.recipe import Heal, Recipe

    config = {"max_position_embeddings": 256}
    refusals = [(surgery.PruneOptions(remove=1, seq_len=512), schema.flag, "--seq-len"),
                (conversion.ConvertOptions(calibration_seq_len=512), schema.flag, "--calibration-seq-len"),
                (evaluation.EvalOptions(seq_len=512), schema.flag, "--seq-len"),
                (Heal(seq_len=512), schema.key_in("heal"), "heal.seq_len"),
                (Recipe(seq_len=512), schema.flag, "seq_len")]
    for settings, name, named in refusals:
        with pytest.raises(MixLNError, match=f"^{named}: 512 exceeds the model's max_position_embeddings 256"):
            schema.check_windows(settings, config, name)
    with pytest.raises(MixLNError, match=re.escape("(--allow-longer to use it anyway)")):
        schema.check_windows(evaluation.EvalOptions(seq_len=512), config)
    with pytest.raises(MixLNError, match=re.escape("(allow_longer_seq: true to use it anyway)")):
        schema.check_windows(Recipe(seq_len=512), config)
    schema.check_windows(evaluation.EvalOptions(seq_len=512, allow_longer=True), config)
    schema.check_windows(Recipe(seq_len=512, allow_longer_seq=True), config)
    schema.check_windows(evaluation.EvalOptions(seq_len=256), config)


def test_a_heal_budget_under_one_step_is_refused_once_against_the_real_step(tiny_llama):
    """Where the budget enters, against the step the heal will run: a heal that a command makes checks it no more."""
    from mixln_convert.healing.run import HealRun
    from mixln_convert.training import load_recipe
    from mixln_convert.workflows.demo import _demo_plan

    with pytest.raises(MixLNError, match=re.escape("heal.tokens: 600 is less than one heal step (4 x 192 = 768")):
        load_recipe(workflows.CPU_RECIPE, [f"source={tiny_llama}", "heal.seq_len=192", "heal.tokens=600"])
    for cls in (conversion.ConvertHealOptions, workflows.SweepOptions):
        with pytest.raises(MixLNError, match=re.escape("--heal-tokens: 10 is less than one heal step (4 x 256")):
            cls(heal_tokens=10)
    with pytest.raises(MixLNError, match="^" + re.escape("--heal-tokens: heal.tokens: 10 is less than one heal step")):
        _demo_plan(workflows.DemoOptions(source=str(tiny_llama), heal_tokens=10))
    with pytest.raises(MixLNError, match="^--tokens: 10 is less than one heal step"):
        HealRun("converted", "teacher", "out", tokens=10)
    HealRun("converted", "teacher", "out", tokens=10, checked=True)  # train, convert and sweep checked it


@pytest.mark.parametrize("kind, value", [
    (schema.Choice(("a", "b")), "c"), (schema.Choice(("a", "b")), "a"), (schema.Names(("a",)), ("a", "a")),
    (schema.Names(("a",)), ("a",)), (schema.Numbers(schema.Number(), 0, 3), [1.0, None]),
    (schema.Numbers(schema.Number(), 0, 3), 1), (schema.Numbers(schema.Number(), 0, 3), [1, 2.5]),
    (schema.Size(), "5GB"), (schema.Size(), "five"), (schema.Count(0, 9), 10), (schema.Number(0, 1), 0.5)])
def test_a_kind_says_ok_exactly_when_its_check_passes(kind, value):
    """A result file's nested checks ask ok() of a kind: one that answered True for anything (a list of numbers
    given 1) let a damaged analysis through to an internal error."""
    try:
        kind.check("key", value)
        passes = True
    except MixLNError:
        passes = False
    assert kind.ok(value) is passes
