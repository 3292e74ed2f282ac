"""The exception family of pydsz: every error the library raises on purpose is a DszError."""


class DszError(Exception):
    """Root of pydsz's errors."""


class FormatError(DszError):
    """A stream or container is corrupt, truncated, of unknown magic or newer version, or fails its checksum."""


class InputError(DszError, ValueError):
    """Input from the user does not fit: a data file, a model, an argument."""


class NoiseError(InputError):
    """The data cannot tell a search's smallest step from noise (Budget.noise_error): a step on its own (pruning
    with `dsz prune`) fails; one of several (pruning inside `dsz compress --prune auto`) is skipped, saying why."""
