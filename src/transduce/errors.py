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


def one_line(err: BaseException | str) -> str:
    """An error's message on one line (whitespace, line breaks included, collapsed), for
    quoting a library's error inside ours."""
    return " ".join(str(err).split())


def require(module: str, extra: str, what: str | None = None):
    """Import an optional dependency, or raise a one-line TransduceError naming the pip extra
    that installs it."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError:
        raise TransduceError(f"{what or 'this'} needs the optional package {module.split('.')[0]!r}; "
                             f"install it with: pip install 'transduce[{extra}]'") from None
