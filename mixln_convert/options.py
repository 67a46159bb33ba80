"""The settings every command shares, torch-free: :class:`Options`, the typed dataclass of a command's options
(each setting declared once: :func:`~mixln_convert.schema.setting`), checked when made (the CLI makes one before
torch is imported) and giving the CLI its options; the groups several commands compose (:class:`Output`,
:class:`Resume`, :class:`Overrides`, :class:`Printed`); the defaults several packages share. Each package declares
its own commands' options beside it (healing/options.py, conversion/options.py, ...)."""

import dataclasses
from dataclasses import dataclass

from .errors import MixLNError
from .limits import parse_size
from .schema import Declared, Flag, PathText, Text, check_settings, setting

# The window of every command that trains or measures (heal, eval, analyze, prune, a recipe) unless a flag or
# recipe key says otherwise: the paper's sequence length; short enough for 2 CPU cores
SEQ_LEN = 256
BATCH_SIZE = 4  # windows per forward pass of a measurement (eval, analyze, prune)
MAX_SHARD_SIZE = "5GB"  # the largest output shard a heal or prune writes, and a conversion's cap


class Options(Declared):
    """A command's typed options: the CLI's options are made from its declared settings, making one checks
    it (each error naming the flag: each setting's range, then :meth:`check_combination` for what settings say of
    each other), and the command's API function takes one or its fields as keyword arguments."""

    def __post_init__(self):
        check_settings(self)
        self.check_combination()

    def check_combination(self) -> None:
        """Checks across settings (each setting's own range is its kind's)."""

    @classmethod
    def given(cls, options=None, settings: dict | None = None):
        """``options`` (default: the defaults) with the fields in ``settings`` replaced, checked again."""
        if options is None:
            return cls(**(settings or {}))
        return dataclasses.replace(options, **settings) if settings else options


class ShardSized:
    """Options that write a checkpoint: ``max_shard_size`` ('5GB', or bytes) in bytes (None: the command's)."""

    @property
    def max_shard_bytes(self) -> int | None:
        return None if self.max_shard_size is None else parse_size(self.max_shard_size, self.flag("max_shard_size"))


# The options several commands take, each declared once in a group that the commands compose (cli.py:
# @click_options(Output)); a command's own --out (a default, a metavar) is its group's same_as of Output's.
@dataclass(frozen=True, kw_only=True)
class Output(Declared):
    """Where a command writes: ``out`` (required unless a command's group declares a default) and ``force``."""
    out: str = setting(kind=PathText(), help="Output folder.", metavar="DIR")
    force: bool = setting(False, Flag(), "Replace a non-empty output folder or an existing output file (never an "
                          "input).")


@dataclass(frozen=True, kw_only=True)
class Resume(Declared):
    resume: bool = setting(False, Flag(), "Continue the interrupted run in --out, keeping what it finished; refused "
                           "if its inputs or settings changed.")


@dataclass(frozen=True, kw_only=True)
class Overrides(Declared):
    """A recipe's keys set on the command line (training/recipe.py's load_recipe reads them)."""
    overrides: tuple[str, ...] = setting((), Text(), "Override a recipe key, dotted for nested ones, e.g. --set "
                                         "optim.lr=3e-4 (repeatable).", flag="--set", metavar="KEY=VALUE",
                                         multiple=True)


# the shared flags as messages name them
OUT, FORCE, RESUME, SET = Output.flag("out"), Output.flag("force"), Resume.flag("resume"), Overrides.flag("overrides")


def check_force_or_resume(force: bool, resume: bool) -> None:
    if force and resume:
        raise MixLNError(f"{FORCE} and {RESUME}: give one ({FORCE} starts afresh, {RESUME} continues)")


@dataclass(frozen=True, kw_only=True)
class Printed(Declared):
    as_json: bool = setting(False, Flag(), "Print the result as JSON (after any other output).", flag="--json")


# here, not in report/: importing any module of that package imports compare() and numpy
@dataclass(frozen=True, kw_only=True)
class CompareOptions(Options):
    """``mixln-convert compare``'s options (report/compare.py): a name for each input in order (default:
    folder names), and whether analyses with different tokenizers are compared (warning) or refused."""
    labels: tuple[str, ...] = setting(  # checked against the inputs, one per input (report/inputs.py)
        (), Text(), "Name of each input in tables and legends, one per input in order (repeatable); a train folder's "
        "arms become NAME/mixln, NAME/preln (and NAME/lns).", flag="--label", metavar="NAME", multiple=True,
        default_help="folder names")
    allow_mismatch: bool = setting(False, Flag(), "Compare analyses made with different tokenizers (with a warning) "
                                   "instead of refusing.")
