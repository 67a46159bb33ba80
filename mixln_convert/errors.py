"""The one exception type the CLI turns into a one-line message and a non-zero exit, and the one
warning type it prints as ``warning: MESSAGE``."""

import re
import warnings

ECHOED = 200  # the characters of one value a message repeats: a 10 MB value must not make a 10 MB line
MESSAGE = 2000  # the characters of a whole message


def shown(value) -> str:
    """``value`` as a message repeats it: cut to ECHOED characters, saying its length (cut once: what
    it gives has no longer run of non-blank characters, so cutting again changes nothing)."""
    text = str(value)
    return text if len(text) <= ECHOED else f"{text[:ECHOED - 3]}... ({len(text):,} characters)"


def bounded(message: str) -> str:
    """``message`` with every run of more than ECHOED non-blank characters cut (:func:`shown`), and the whole
    cut after MESSAGE characters: what it echoes of the user's input stays readable."""
    text = re.sub(rf"\S{{{ECHOED + 1},}}", lambda run: shown(run.group()), str(message))
    return text if len(text) <= MESSAGE else f"{text[:MESSAGE - 60]}... ({len(text):,} characters in all)"


class MixLNError(Exception):
    """A user-facing error (bad input, a refused destination, an unsupported checkpoint); its
    message must name the file, flag or value at fault, on one line (:func:`bounded`)."""

    def __init__(self, message: str = ""):
        super().__init__(bounded(message))


class MixLNWarning(UserWarning):
    """Something about a result the user should know (a heal that made the model worse, fewer tokens
    than asked for, a damaged checkpoint skipped) while the run goes on."""


def first_line(error: Exception) -> str:
    """The first line of ``error``'s message, or its type's name where it has none: a one-line reason."""
    return (str(error).strip().splitlines() or [type(error).__name__])[0]


def warn(message: str) -> None:
    warnings.warn(message, MixLNWarning, stacklevel=3)  # names the caller of the function that warns
