"""Errors a user can act on.

A ``ScaletrainError`` is a user mistake or an environment problem: the CLI prints its one-line
message and exits non-zero without a traceback (``--debug`` shows it). Internal invariants use
``assert``.
"""

from __future__ import annotations


class ScaletrainError(Exception):
    """One-line, actionable error: what happened, the likely cause and the setting to change."""

    exit_code = 2
    label = "error"  # the CLI prints "<label>: <message>"


class ConfigError(ScaletrainError):
    """A config file, key or value is wrong; the message names the key and what is allowed."""


class DataError(ScaletrainError):
    """A data file is missing, empty or lacks a column."""


class LaunchError(ScaletrainError):
    """The job cannot start: cluster too small, backend without a device, run directory taken."""


class StorageError(ScaletrainError):
    """A file of the run cannot be written (disk full, no permission, I/O error); the message names the path
    and the free space."""

    exit_code = 1


class Interrupted(ScaletrainError):
    """The user asked the run to stop (Ctrl-C, SIGTERM) and it stopped as asked: not an error."""

    exit_code = 130
    label = "stopped"


class TrainingError(ScaletrainError):
    """Training failed on one or more ranks; the message groups causes by rank."""

    exit_code = 1
