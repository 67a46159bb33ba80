"""Every command's options as --help shows them (names, type, range, default, flags), compared with
tests/data/cli_options.json: the options are made from one schema (the packages' options.py), and a change to a
name, type, default or range shows here. After an intended change: python tests/test_cli_options.py --write."""

import json
import sys
from pathlib import Path

import click

from mixln_convert.cli import main

SNAPSHOT = Path(__file__).parent / "data" / "cli_options.json"


def _type(kind: click.ParamType) -> dict:
    described = {"type": type(kind).__name__}
    if isinstance(kind, click.Choice):
        described["choices"] = list(kind.choices)
    if isinstance(kind, (click.IntRange, click.FloatRange)):
        described.update(min=kind.min, max=kind.max, min_open=kind.min_open, max_open=kind.max_open)
    return described


def _plain(default):
    """A default as JSON holds it: click's "no default" sentinel (a flag or a repeatable option left out) as None."""
    return default if isinstance(default, (str, int, float, bool, list, tuple, type(None))) else None


def described_options() -> dict:
    """{command: {option name: what --help says of it}} of every command."""
    commands = {}
    for name, command in sorted(main.commands.items()):
        options, ctx = {}, click.Context(command)
        for param in command.params:
            if not isinstance(param, click.Option) or param.name == "help":
                continue
            names, shown = param.get_help_record(ctx)  # the option's line of --help: metavar, help, default, range
            options["/".join(param.opts + param.secondary_opts)] = {
                **_type(param.type), "dest": param.name, "default": _plain(param.get_default(ctx)), "is_flag": param.is_flag,
                "multiple": param.multiple, "required": param.required, "usage": names, "help": shown}
        arguments = [param.name for param in command.params if isinstance(param, click.Argument)]
        commands[name] = {"arguments": arguments, "options": options}
    return json.loads(json.dumps(commands))  # tuples as lists, as the snapshot holds them


def test_every_option_is_as_recorded():
    recorded = json.loads(SNAPSHOT.read_text())
    now = described_options()
    assert sorted(now) == sorted(recorded)
    for command in recorded:
        assert now[command]["arguments"] == recorded[command]["arguments"], command
        assert sorted(now[command]["options"]) == sorted(recorded[command]["options"]), command
        for option, described in recorded[command]["options"].items():
            assert now[command]["options"][option] == described, f"{command} {option}"



def test_a_shared_flag_says_the_same_in_every_command():
    """--force, --resume, --set and --json are each declared once (mixln_convert/options.py's groups): one help text."""
    helps = {}
    for command in described_options().values():
        for option, described in command["options"].items():
            helps.setdefault(option, set()).add(described["help"])
    for option in ("--force", "--resume", "--set", "--json"):
        assert len(helps[option]) == 1, (option, helps[option])


def test_every_option_is_declared():
    """No option is written by hand in cli.py: each comes from a declared setting (schema.click_options)."""
    assert "click.option(" not in (Path(__file__).parent.parent / "mixln_convert" / "cli.py").read_text()


if __name__ == "__main__" and sys.argv[1:] == ["--write"]:
    SNAPSHOT.write_text(json.dumps(described_options(), indent=1, sort_keys=True) + "\n")
