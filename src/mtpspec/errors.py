"""Errors mtpspec raises for a user's mistake. Each message says what was wrong and what to do."""


class MtpspecError(Exception):
    """Base class: the CLI prints the message on one line and exits with status 2."""


class UnsupportedModelError(MtpspecError):
    """The target's architecture is not one the head knows how to attach to."""


class HeadMismatchError(MtpspecError):
    """A saved head was trained for a different target."""


class InputError(MtpspecError):
    """A malformed request: bad shapes, batch size, token ids or sampling settings."""


class DataError(MtpspecError):
    """A missing, empty or unreadable data or prompt file."""


class BusyError(MtpspecError):
    """The server's queue is full: the request was not accepted; retry later."""
