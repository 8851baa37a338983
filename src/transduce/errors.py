"""User-facing errors.

Anything a user can cause (a bad config value, a missing file, a corrupt checkpoint) raises a
subclass of :class:`TransduceError`. The CLI prints its message as one line and exits with
status 2; programming errors keep their tracebacks.
"""


class TransduceError(Exception):
    """An error caused by user input; its message is one self-contained line."""


class ConfigError(TransduceError, ValueError):
    """An invalid configuration value. The message names the offending key."""


class DataError(TransduceError):
    """Unreadable, missing or malformed data (the message names file and line)."""


class CheckpointError(TransduceError):
    """A model directory or checkpoint that is missing, corrupt or does not match."""
