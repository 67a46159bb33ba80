"""The one exception type the CLI turns into a one-line message and a non-zero exit, and the one
warning type it prints as ``warning: MESSAGE``."""

import warnings


class MixLNError(Exception):
    """A user-facing error (bad input, a refused destination, an unsupported checkpoint); its
    message must name the file, flag or value at fault, on one line."""


class MixLNWarning(UserWarning):
    """Something about a result the user should know (a heal that made the model worse, fewer tokens
    than asked for, a damaged checkpoint skipped) while the run goes on."""


def first_line(error: Exception) -> str:
    """The first line of ``error``'s message, or its type's name where it has none: a one-line reason."""
    return (str(error).strip().splitlines() or [type(error).__name__])[0]


def warn(message: str) -> None:
    warnings.warn(message, MixLNWarning, stacklevel=3)  # names the caller of the function that warns
