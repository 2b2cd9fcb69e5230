"""User-facing errors.

Every error a user can cause (a bad file, a bad config key, a bad argument) is raised as a
subclass of KimiAudioError with a one-line message that names the culprit and says what was
expected. The CLI prints the message and exits non-zero; the server turns it into an HTTP 4xx.
"""


class KimiAudioError(Exception):
    """Base class: the message is shown to the user as it is, on one line."""


class ConfigError(KimiAudioError):
    """A config file or override has a bad key or value."""


class CheckpointError(KimiAudioError):
    """A checkpoint file is missing or does not have the expected layout."""


class AudioInputError(KimiAudioError):
    """An input audio file or buffer cannot be used (unreadable, empty, silent, too long)."""


class AudioTooLongError(AudioInputError):
    """An audio file longer than the limit its decoding was given."""


class StoreUnavailableError(KimiAudioError):
    """The conversation database does not answer (lost connection, server down) or its SQLite file
    cannot be used for now (disk full, read-only, locked): the server answers 503 until it is back."""
