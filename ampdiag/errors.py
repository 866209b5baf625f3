"""Errors that ampdiag reports to a user as one line (exit code 2), never as a traceback."""


class InputError(Exception):
    """Bad input from the user: a missing path, an unreadable or foreign file, a bad option.

    The CLI prints ``ampdiag: <message>`` on stderr and exits with code 2.
    """


class OutputError(InputError):
    """The output folder cannot be created or written."""
