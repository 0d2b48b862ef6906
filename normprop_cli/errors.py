"""The one error type the command line turns into a one-line message and exit code 2."""


class UserError(Exception):
    """Bad input: an unknown name, an impossible override, a missing data set.

    The message is one line that says what was wrong and what to do.
    """

    exit_code = 2

    def __init__(self, message: str):
        super().__init__(" ".join(str(message).split()))
