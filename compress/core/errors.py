"""Errors a user can act on. Each carries the exit code the CLI returns and a one-line
message that says what to do; anything else is a bug (exit 1)."""

from __future__ import annotations

EXIT_OK = 0
EXIT_UNEXPECTED = 1
EXIT_USAGE = 2  # bad usage, recipe or input
EXIT_BUDGET = 3  # no compressed variant met the accuracy budget (the CI gate)


class CompressError(Exception):
    """A problem with the user's input (recipe, model, data, command line): exit 2."""

    exit_code = EXIT_USAGE


class RecipeError(CompressError):
    """A recipe that does not validate. `where` is the file, `key` the YAML key path."""

    def __init__(self, where: str, key: str, message: str):
        self.where, self.key, self.message = where, key, message
        location = f"{where}: {key}" if key else where
        super().__init__(f"{location}: {message}")


class DataError(CompressError):
    """Data that cannot be used: missing columns, bad labels, empty split, unparsable file."""


class ModelSourceError(CompressError):
    """A model that cannot be found or loaded."""


class ArtifactError(CompressError):
    """A stage output that is missing, corrupt or of the wrong kind."""


class StageError(CompressError):
    """A stage that ran but whose result is unusable (for example an export parity failure)."""
