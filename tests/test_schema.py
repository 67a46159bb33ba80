"""One schema: each setting's kind gives its click option's type, the API's check and the recipe's,
so a value outside a range is refused the same way wherever it enters, naming the flag or key."""

import dataclasses
import re

import click
import pytest

from mixln_convert import options, schema
from mixln_convert.errors import MixLNError
from mixln_convert.schema import Count, Number, declared, flag

OPTIONS = [cls for cls in vars(options).values()
           if isinstance(cls, type) and issubclass(cls, options.Options) and dataclasses.is_dataclass(cls)]


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
    cls(**{options.PruneOptions: {"remove": 1}, options.ExportOptions: {"to": "llama"}}.get(cls, {}))


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
        assert declared(Heal)[name][1] is declared(options.HealOptions)[name][1]
    heal_budget = [declared(cls)["heal_tokens"][1] for cls in (options.DemoOptions, options.SweepOptions,
                                                               options.ConvertHealOptions)]
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

    recipe = load_recipe(options.CPU_RECIPE, [f"source={tiny_llama}"])
    assert recipe.global_batch_size * recipe.seq_len == options.CPU_STEP_TOKENS
    assert options.DEMO_TRAIN_TOKENS % options.CPU_STEP_TOKENS == 0


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
