"""The one exception type the CLI turns into a one-line message and a non-zero exit."""


class MixLNError(Exception):
    """A user-facing error: bad input, a refused destination, an unsupported checkpoint.

    The message must name the file, flag or value at fault, on one line.
    """
