"""The one error type the command line turns into a one-line message and exit code 2."""


class UserError(Exception):
    """Bad input: an unknown name, an impossible override, a missing data set.

    The message is one line that says what was wrong and what to do.
    """

    exit_code = 2

    def __init__(self, message: str):
        super().__init__(" ".join(str(message).split()))


def first_line(exc: BaseException, limit: int | None = None) -> str:
    """The first non-blank line of an exception's message (its type's name when it has none), cut to
    `limit` characters: the reason quoted inside a one-line error."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return (lines[0] if lines else type(exc).__name__)[:limit]
