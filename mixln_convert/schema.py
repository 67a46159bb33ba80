"""One declaration per setting: a dataclass field made by :func:`setting` holds its kind (type and
range), default, help and flag. The commands' click options (:func:`click_options`), the API's checks
(:func:`check_settings`) and a recipe's YAML and ``--set`` reading (training/recipe.py) are all made
from it, so a setting's range, default and name are written once. Torch-free."""

import dataclasses
import functools
import math
import os
from dataclasses import dataclass

import click

from .errors import MixLNError, shown
from .limits import MAX_BATCH, MAX_TOKENS, SEED_LIMIT, is_finite_number, is_integral, parse_size


def _bound(value: int) -> str:
    """10**13 as '10^13', 2**32 - 1 as '2^32)' (the interval then open), else the number."""
    if value >= 10**6 and math.log10(value).is_integer():
        return f"10^{round(math.log10(value))}]"
    if value >= 2**16 and math.log2(value + 1).is_integer():
        return f"2^{round(math.log2(value + 1))})"
    return f"{value}]"


class Kind:
    """The values a setting takes: ``ok`` says whether one is, ``describe`` says which (in errors),
    ``read`` types a value from YAML or ``--set`` (ValueError: not of the type), ``click_type`` is its
    option's type."""
    click_type = None

    def ok(self, value) -> bool:
        return True

    def describe(self) -> str:
        return "a value"

    def check(self, name: str, value) -> None:
        """A one-line error naming ``name`` (a flag or recipe key) unless ``value`` is one of the kind's."""
        if not self.ok(value):
            raise MixLNError(f"{name}: must be {self.describe()}, got {shown(repr(value))}")

    def read(self, value):
        return value

    def record(self, value, where: str, key: str):
        """``value``, the field ``key`` of a result file (``where``), checked and as its record holds it."""
        self.check(f"{where}: {key}", value)
        return value


@dataclass(frozen=True)
class Count(Kind):
    """An integer in [low, high]: every count has an upper bound (a typo's extra zeros are refused)."""
    low: int = 1
    high: int = MAX_TOKENS

    def ok(self, value) -> bool:
        return is_integral(value) and self.low <= value <= self.high

    def describe(self) -> str:
        return f"an integer in [{self.low}, {_bound(self.high)}"

    def read(self, value):
        number = float(value) if isinstance(value, str) else value  # "2e8" from --set
        if isinstance(number, bool) or not isinstance(number, (int, float)) or number != int(number):
            raise ValueError
        return int(number)

    @property
    def click_type(self):
        return click.IntRange(self.low, self.high)


TOKENS, TOKENS_OR_ZERO = Count(1), Count(0)
BATCH = Count(1, MAX_BATCH)  # sequences in one forward pass: past any accelerator's memory
SEED = Count(0, SEED_LIMIT - 1)  # numpy's and torch's seeds are 32-bit


@dataclass(frozen=True)
class Window(Count):
    """A window of tokens, at most the model's ``max_position_embeddings`` (positions past it were never seen in
    pre-training) unless the :class:`Flag` setting ``opt_in`` beside it is on (:func:`check_windows`)."""
    opt_in: str | None = None


@dataclass(frozen=True)
class Number(Kind):
    """A finite number, within the bounds given (None: unbounded on that side)."""
    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False

    def ok(self, value) -> bool:
        if not is_finite_number(value):
            return False
        above = self.low is None or (value > self.low if self.low_open else value >= self.low)
        return above and (self.high is None or (value < self.high if self.high_open else value <= self.high))

    def describe(self) -> str:
        if self.low is not None and self.high is not None:
            return (f"in {'(' if self.low_open else '['}{self.low:g}, {self.high:g}"
                    f"{')' if self.high_open else ']'}")
        if self.low is not None:
            return f"a number {'>' if self.low_open else '>='} {self.low:g}"
        return "a finite number"

    def read(self, value):
        if isinstance(value, bool) or not isinstance(value, (int, float, str)):
            raise ValueError
        return float(value)

    @property
    def click_type(self):
        # nan passes click's FloatRange: check_settings refuses it (and every other bad value) once more
        return click.FloatRange(self.low, self.high, min_open=self.low_open, max_open=self.high_open)


FRACTION, OPEN_FRACTION = Number(0, 1), Number(0, 1, low_open=True, high_open=True)
POSITIVE_NUMBER, NONNEGATIVE = Number(0, low_open=True), Number(0)


class SpikeFactor(Number):
    """A loss-spike guard's factor (training/loop.py): 0 turns it off; a factor of 1 or less would skip
    ordinary steps."""

    def __init__(self):
        super().__init__(0, 1000)

    def ok(self, value) -> bool:
        return super().ok(value) and (value == 0 or value > 1)

    def describe(self) -> str:
        return "0 (off) or in (1, 1000]"


class Checked(Kind):
    """A kind whose :meth:`check` gives the reason a value is not one: ``ok`` is whether it passes."""

    def ok(self, value) -> bool:
        try:
            self.check("value", value)
        except MixLNError:
            return False
        return True


@dataclass(frozen=True)
class Choice(Checked):
    choices: tuple
    noun: str = "value"  # what a choice is, in errors: "unknown dtype 'fp8'"

    def check(self, name: str, value) -> None:
        if value not in self.choices:
            raise MixLNError(f"{name}: unknown {self.noun} {shown(repr(value))} "
                             f"(choose from {', '.join(self.choices)})")

    def read(self, value):
        if not isinstance(value, str):
            raise ValueError
        return value

    def describe(self) -> str:
        return f"one of {', '.join(self.choices)}"

    @property
    def click_type(self):
        return click.Choice(self.choices)


class Flag(Kind):
    def ok(self, value) -> bool:
        return isinstance(value, bool)

    def describe(self) -> str:
        return "true or false"

    def read(self, value):
        if not isinstance(value, bool):
            raise ValueError
        return value


class Text(Kind):
    """A path, name or pattern: read where it is opened (io/paths.py), which names what is wrong with it."""

    def read(self, value):
        if not isinstance(value, (str, int, float)) or isinstance(value, bool):
            raise ValueError
        return str(value)

    def describe(self) -> str:
        return "a string"


class String(Text):
    """A string as a result file holds it (a setting's path or name is a :class:`Text`)."""

    def ok(self, value) -> bool:
        return isinstance(value, str)


@dataclass(frozen=True)
class Shaped(Kind):
    """A value of a result file passing ``test``, an object or list of a shape ``description`` says."""
    test: object
    description: str

    def ok(self, value) -> bool:
        return self.test(value)

    def describe(self) -> str:
        return self.description


@dataclass(frozen=True)
class ByName(Kind):
    """An object of values of the kind ``item`` by name (a figure's interval, a stage's seconds); ``or_none``: a
    value may be null (not measured)."""
    item: Kind
    or_none: bool = False

    def ok(self, value) -> bool:
        return isinstance(value, dict) and all((item is None and self.or_none) or self.item.ok(item)
                                               for item in value.values())

    def describe(self) -> str:
        return f"an object, each {self.item.describe()}{' or null' if self.or_none else ''}"

    def record(self, value, where: str, key: str):
        if not isinstance(value, dict):
            raise MixLNError(f"{where}: {key}: must be {self.describe()}, got {shown(repr(value))}")
        return {name: item if item is None and self.or_none else self.item.record(
            item, where, f"{key}.{name}" if key else name) for name, item in value.items()}


class PathText(Text):
    """A path a command writes or reads, as click takes it (its metavar PATH)."""
    click_type = click.Path(path_type=str)


@dataclass(frozen=True)
class Nested(Kind):
    """An object of a result file held as the dataclass ``cls`` (``what`` it is, in errors); ``many``: a list of
    them (an object of them by name is a :class:`ByName` of one)."""
    cls: type
    what: str = "an object"
    many: bool = False

    def describe(self) -> str:
        return f"a list, each {self.what}" if self.many else self.what

    def record(self, value, where: str, key: str):
        if not self.many:
            return read_record(self.cls, value, where, self.what, key)
        if not isinstance(value, list):
            raise MixLNError(f"{where}: {key}: must be {self.describe()}, got {shown(repr(value))}")
        return [read_record(self.cls, item, where, self.what, f"{key}[{n}]") for n, item in enumerate(value)]


class Folder(Text):
    def ok(self, value) -> bool:
        return os.path.isdir(value)

    def describe(self) -> str:
        return "an existing folder"


class Size(Checked):
    """A size in bytes or with a unit: '5GB', '500MiB' (limits.parse_size)."""

    def check(self, name: str, value) -> None:
        parse_size(value, name)

    def read(self, value):
        if isinstance(value, bool) or not isinstance(value, (str, int)):
            raise ValueError
        return value

    def describe(self) -> str:
        return "a size (5GB, 500MB)"


@dataclass(frozen=True)
class Names(Checked):
    """Distinct names (of ``choices`` where given), ``low`` to ``high`` of them; on the command line
    comma-separated, in YAML a list (or one name)."""
    choices: tuple | None = None
    low: int = 1
    high: int = 256
    noun: str = "name"

    def check(self, name: str, value) -> None:
        if isinstance(value, str) or not isinstance(value, (list, tuple)):
            raise MixLNError(f"{name}: must be a list of names, got {shown(repr(value))}")
        given = ",".join(map(str, value))  # as given on the command line
        for item in value:
            if not (isinstance(item, str) and item.strip()):
                raise MixLNError(f"{name}: {shown(given)!r} holds an empty name")
            if self.choices is not None and item not in self.choices:
                raise MixLNError(f"{name}: unknown {self.noun} {shown(item)!r} (choose from {', '.join(self.choices)})")
        twice = [item for i, item in enumerate(value) if item in value[:i]]
        if twice:
            raise MixLNError(f"{name}: {shown(twice[0])!r} is given twice")
        if not self.low <= len(value) <= self.high:
            raise MixLNError(f"{name}: give {self.low} to {self.high} names, got {len(value)}")

    def describe(self) -> str:
        return "a list of names"

    def read(self, value):
        value = [value] if isinstance(value, str) else value
        if not isinstance(value, (list, tuple)) or not all(isinstance(item, str) for item in value):
            raise ValueError
        return tuple(value)

    @property
    def click_type(self):
        return CommaList(str)


@dataclass(frozen=True)
class Numbers(Checked):
    """Numbers each of ``item``, ``low`` to ``high`` of them (comma-separated on the command line)."""
    item: Number
    low: int = 1
    high: int = 100

    def check(self, name: str, value) -> None:
        if isinstance(value, str) or not isinstance(value, (list, tuple)):
            raise MixLNError(f"{name}: must be a list of numbers, got {shown(repr(value))}")
        if not self.low <= len(value) <= self.high:
            count = str(self.low) if self.low == self.high else f"{self.low} to {self.high}"
            raise MixLNError(f"{name}: give {count} numbers, got {len(value)}")
        for item in value:
            if not self.item.ok(item):
                raise MixLNError(f"{name}: {shown(repr(item))} is not {self.item.describe()}")

    def describe(self) -> str:
        return "a list of numbers"

    def read(self, value):
        if not isinstance(value, (list, tuple)):
            raise ValueError
        return tuple(self.item.read(item) for item in value)

    @property
    def click_type(self):
        return CommaList(float)


def comma_list(text: str) -> tuple[str, ...]:
    """'a, b' -> ('a', 'b'); an empty item or one given twice is kept, for the kind to refuse."""
    return tuple(item.strip() for item in text.split(","))


class CommaList(click.ParamType):
    """'a,b' -> ('a', 'b'); with float, '0,0.25' -> (0.0, 0.25). The kind checks what it holds."""
    name = "list"

    def __init__(self, item=str):
        self.item = item

    def convert(self, value, param, ctx):
        if isinstance(value, (tuple, list)):
            return tuple(value)
        try:
            return tuple(self.item(item) for item in comma_list(value))
        except ValueError:
            self.fail(f"{value!r} is not a comma-separated list of numbers", param, ctx)


@dataclass(frozen=True)
class Setting:
    """A setting's declaration beside its default (the dataclass field's): ``help`` None makes it no
    command-line option; ``flag`` is its option ('--x', or '--x/--no-x' for a switch; default from the field's
    name); ``default_help`` replaces the shown default where it is worked out later; ``multiple``: a
    repeatable option. A field without a default is a required option."""
    kind: Kind
    help: str | None = None
    flag: str | None = None
    metavar: str | None = None
    default_help: str | None = None
    multiple: bool = False


def setting(default=dataclasses.MISSING, kind: Kind = Text(), help: str | None = None, *,
            factory=dataclasses.MISSING, **declared):
    """A dataclass field declaring one setting (:class:`Setting`'s ``declared`` fields)."""
    return dataclasses.field(default=default, default_factory=factory,
                             metadata={"setting": Setting(kind, help, **declared)})


def declared(cls) -> dict[str, tuple[dataclasses.Field, Setting]]:
    """{field name: (field, setting)} of ``cls``'s declared settings, in declaration order."""
    return {f.name: (f, f.metadata["setting"]) for f in dataclasses.fields(cls) if "setting" in f.metadata}


def flag(f: dataclasses.Field, off: bool = False) -> str:
    """The option naming field ``f`` ('--max-tokens'; ``off``: a switch's off side, '--no-layer-sweep'); a field that
    is no option by its name."""
    found = f.metadata.get("setting")
    if found is None or found.help is None:
        return f.name
    return (found.flag or f"--{f.name.replace('_', '-')}").split("/")[-1 if off else 0]


def same_as(cls, name: str, **changes):
    """A field declaring the setting ``name`` of ``cls`` again, where another section holds it too (a recipe's
    data.num_proc is tokenize's --num-proc), but for a new ``default`` and ``changes`` of :class:`Setting`'s."""
    f = declared(cls)[name][0]
    default = changes.pop("default", f.default)
    metadata = {"setting": dataclasses.replace(f.metadata["setting"], **changes)} if changes else f.metadata
    return dataclasses.field(default=default, default_factory=f.default_factory, metadata=metadata)


class Declared:
    """A dataclass of declared settings, naming them as its options do."""

    @classmethod
    def flag(cls, name: str, off: bool = False) -> str:
        """The option naming the setting ``name`` (:func:`flag`), for a message written outside the declaration."""
        return flag(declared(cls)[name][0], off)

    def flagged(self, *names: str) -> dict:
        """{option: value} of the settings ``names``: what a run records of them (its run.json), by their options."""
        return {self.flag(name): getattr(self, name) for name in names}


def default_of(f: dataclasses.Field):
    return f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default


def check_settings(obj) -> None:
    """Each declared setting of the dataclass ``obj`` checked against its kind, an error naming its flag; a
    setting whose default is None may be None (left to the command to work out)."""
    for f, found in declared(type(obj)).values():
        value = getattr(obj, f.name)
        if value is None and default_of(f) is None:
            continue
        if found.multiple and not isinstance(value, (list, tuple)):
            raise MixLNError(f"{flag(f)}: must be a list, got {shown(repr(value))}")
        for item in value if found.multiple else (value,):
            found.kind.check(flag(f), item)


def read_record(cls, record, where: str, what: str = "a record", key: str = ""):
    """An instance of the dataclass ``cls`` from ``record`` (a JSON object read from ``where``, ``what`` it should
    be; ``key``: where in the file, for a nested object), each declared field checked against its kind; keys not
    declared are ignored (a newer version's)."""
    at = f"{where}: {key}" if key else where
    if not isinstance(record, dict):
        raise MixLNError(f"{at}: not {what} (not a JSON object)")
    fields = declared(cls)
    missing = [name for name, (f, _) in fields.items() if name not in record and default_of(f) is dataclasses.MISSING]
    if missing:
        raise MixLNError(f"{at}: not {what} (missing {', '.join(missing)})")
    values = {}
    for name, (f, found) in fields.items():
        if name in record:  # None where the default is None: not measured (as check_settings lets it be)
            value = record[name]
            values[name] = value if value is None and default_of(f) is None else found.kind.record(
                value, where, f"{key}.{name}" if key else name)
    return cls(**values)


def key_in(section: str):
    """Names of a recipe section's settings in errors: ``heal.seq_len`` (a top-level key's is :func:`flag`'s)."""
    return lambda f: f"{section}.{f.name}"


def flag_in(section: str):
    """Names of a section's settings as another command's flags: heal's --tokens is convert's --heal-tokens."""
    return lambda f: f"--{section}-{flag(f)[2:]}"


def check_windows(obj, config: dict, name=flag) -> None:
    """Each :class:`Window` setting of the dataclass ``obj`` against the model's ``config``, named ``name(field)``."""
    settings, limit = declared(type(obj)), config.get("max_position_embeddings")
    for f, found in settings.values():
        if not (isinstance(found.kind, Window) and limit and getattr(obj, f.name) > limit):
            continue
        opt_in = found.kind.opt_in and settings[found.kind.opt_in][0]
        if opt_in and getattr(obj, opt_in.name):
            continue
        hint = opt_in and f" ({name(opt_in)}{'' if name(opt_in).startswith('--') else ': true'} to use it anyway)"
        raise MixLNError(f"{name(f)}: {getattr(obj, f.name)} exceeds the model's max_position_embeddings {limit}"
                         f"{hint or ''}")


def click_options(cls, *names: str, into: str | None = None):
    """A decorator adding the click options of ``cls``'s settings ``names`` (default: every one with help); with
    ``into``, the command takes them made into one ``cls`` (checked) as its argument ``into``."""
    settings = declared(cls)
    chosen = names or [name for name, (_, found) in settings.items() if found.help is not None]

    def add(command):
        if into is not None:
            command = _made_into(cls, chosen, into, command)
        for name in reversed(chosen):
            f, found = settings[name]
            default = default_of(f)
            required = default is dataclasses.MISSING
            # a required option is given no default: click 8.3 takes an explicit None as one, and never asks for it
            given = {} if required else {"default": default}
            declaration = found.flag or f"--{name.replace('_', '-')}"
            if isinstance(found.kind, Flag) and "/" not in declaration:
                option = click.option(declaration, name, is_flag=True, default=default, help=found.help)
            else:
                shown_default = found.default_help or (_default_text(default) if isinstance(default, tuple) and default
                                                       else None)
                help_text = f"{found.help}  [default: {shown_default}]" if shown_default else found.help
                option = click.option(declaration, name, type=found.kind.click_type, **given,
                                      required=required, multiple=found.multiple, metavar=found.metavar,
                                      help=help_text, show_default=not shown_default and (default not in (None, ())))
            command = option(command)
        return command
    return add


def _made_into(cls, names, into: str, command):
    @functools.wraps(command)  # its click options so far too
    def made(**given):
        options = cls(**{name: given.pop(name) for name in names})
        return command(**given, **{into: options})
    return made


def _default_text(default: tuple) -> str:
    """A list default as --help shows it: comma-separated, as it is given."""
    return ",".join(f"{item:g}" if isinstance(item, float) else str(item) for item in default)

