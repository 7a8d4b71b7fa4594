"""User-facing errors: one clear line, exit code 2, nothing written."""


class UserError(Exception):
    """Bad input from the user (a file, a key, a URL, an id). The CLI prints it as one line and exits 2."""

    exit_code = 2

    def __init__(self, message: str):
        super().__init__(" ".join(str(message).split()))


class UsageError(UserError):
    """A flag's value, or a combination of flags, that the command does not take. The CLI adds a pointer to the
    command's --help."""
