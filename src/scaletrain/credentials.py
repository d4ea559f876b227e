"""What counts as a secret: by the variable's name, and by the value's shape (credentials have recognisable
forms whatever they are called: ``Bearer ...``, ``hf_...``, ``sk-...``, ``ghp_...``, AWS key ids, JWTs).

Ground floor: the standard library only. ``redact.py`` masks what this module recognises; ``comm/`` uses it to
keep secret values out of Ray's ``runtime_env`` (which Ray logs on every node and shows in its dashboard).
"""

from __future__ import annotations

import fnmatch
import math
import re
from collections import Counter

# Variables whose values are secret whatever they look like.
# (AWS: the credentials; AWS_ENDPOINT_URL, AWS_REGION or AWS_PROFILE are settings, kept readable in logs and in
# storage.endpoint_url when it holds the same value.)
SECRET_NAME_PATTERNS = ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "*_API_KEY", "*_SECRET*", "*_TOKEN",
                        "AWS_ACCESS_KEY_ID", "AWS_SECURITY_TOKEN", "AZURE_STORAGE_KEY", "AZURE_STORAGE_ACCOUNT_KEY",
                        "AZURE_STORAGE_CONNECTION_STRING", "AZURE_STORAGE_SAS_TOKEN",
                        "*PASSWORD*", "*_PASS", "*_PASSWD")
# Variables whose long, random-looking values are secret (AUTH_HEADER, SERVICE_KEY, DB_PASS, GCP_CREDENTIALS).
HINT_NAME_PARTS = ("AUTH", "KEY", "PASS", "CRED", "TOKEN", "SECRET")
MIN_SECRET_LEN = 6  # shorter values are not masked by name: masking "1" or "true" everywhere would be noise

# Credential forms found anywhere in a text, each matching the secret part only: the kind stays readable
# ("Bearer ***", "hf_***", "sk-***") so a log still says which credential was used.
SHAPES: dict[str, re.Pattern] = {
    "bearer": re.compile(r"(?i)(?<=\bbearer )[A-Za-z0-9._~+/=-]{8,}"),
    "huggingface": re.compile(r"(?<=\bhf_)[A-Za-z0-9]{16,}\b"),
    "openai-style": re.compile(r"(?<=\bsk-)[A-Za-z0-9_-]{16,}"),
    "github": re.compile(r"(?:(?<=\bgh[pousr]_)[A-Za-z0-9]{36,}|(?<=\bgithub_pat_)[A-Za-z0-9_]{22,})\b"),
    "aws-key-id": re.compile(r"(?<=\bAKIA|\bASIA)[A-Z0-9]{16}\b"),
    "jwt": re.compile(r"\beyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}"),
}
# ``scheme://user:PASSWORD@host``: the password part.
URL_CREDENTIALS = re.compile(r"(?P<scheme>[a-zA-Z][a-zA-Z0-9+.-]*://)(?P<user>[^:/@\s]*):(?P<secret>[^@/\s]+)@")


def is_secret_name(name: str) -> bool:
    return any(fnmatch.fnmatchcase(name.upper(), p) for p in SECRET_NAME_PATTERNS)


def has_secret_shape(value: str) -> bool:
    return any(p.search(value) for p in SHAPES.values()) or bool(URL_CREDENTIALS.search(value))


_SEPARATORS = re.compile(r"[-_./:+=~]")


def looks_random(value: str) -> bool:
    """A long token of mixed letters and digits with high entropy (an AWS secret key, an API key); not a git sha
    or a UUID (hex: no upper case), a path or a model name (short pieces between separators)."""
    if len(value) < 20 or any(c.isspace() for c in value):
        return False
    pieces = _SEPARATORS.split(value)
    if max(map(len, pieces)) < 16 and len(pieces) - 1 > len(value) / 10:  # word-like pieces: a name, not a key
        return False
    if not (any(c.islower() for c in value) and any(c.isupper() for c in value) and any(c.isdigit() for c in value)):
        return False
    counts = Counter(value)
    entropy = -sum(n / len(value) * math.log2(n / len(value)) for n in counts.values())
    return entropy >= 4.0


def looks_like_secret(name: str, value: str) -> bool:
    """Whether a variable (or config key) ``name`` holding ``value`` is a credential."""
    if len(value) >= MIN_SECRET_LEN and is_secret_name(name):
        return True
    if has_secret_shape(value):
        return True
    upper = name.upper()
    return any(part in upper for part in HINT_NAME_PARTS) and looks_random(value)


def split_secrets(env: dict[str, str]) -> tuple[dict[str, str], dict[str, str]]:
    """(public, secret) variables: the secret ones must not travel where they are logged."""
    public, secret = {}, {}
    for key, value in env.items():
        (secret if looks_like_secret(key, value) else public)[key] = value
    return public, secret
