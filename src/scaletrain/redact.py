"""Keep secrets out of logs, config dumps and error messages.

Redacts the values of secret-looking environment variables (HF_TOKEN, *_API_KEY, *_SECRET*, AWS_*, ...),
credentials in URLs (``https://user:TOKEN@host``), token-like query parameters and ``KEY=value`` pairs
whose key looks secret, and Hugging Face token literals.
"""

from __future__ import annotations

import logging
import re
from typing import Any, Iterable, Mapping

from scaletrain.comm.env import is_secret_name, secret_values

MASK = "***"

_URL_CREDENTIALS = re.compile(r"(?P<scheme>[a-zA-Z][a-zA-Z0-9+.-]*://)(?P<user>[^:/@\s]*):(?P<secret>[^@/\s]+)@")
_QUERY_TOKEN = re.compile(r"(?i)([?&](?:token|access_token|api_key|apikey|key|sig|signature|password)=)[^&\s]+")
_SECRET_ASSIGN = re.compile(
    # The key must end in the secret word ("eval/tokens" and "tokens_per_s" are metrics, not secrets).
    r"(?i)\b([A-Z0-9_]*(?:TOKEN|API_KEY|SECRET|PASSWORD|ACCESS_KEY)(?:_KEY)?)(?![A-Za-z0-9])"
    r"(['\"]?\s*[=:]\s*['\"]?)([^\s'\",;}&]+)")
_HF_TOKEN = re.compile(r"\bhf_[A-Za-z0-9]{16,}\b")


class Redactor:
    def __init__(self, secret_values: Iterable[str] = ()):
        # Longest first, so a secret that contains another is masked whole.
        self.values = sorted({v for v in secret_values if v}, key=len, reverse=True)

    @classmethod
    def from_environment(cls, comm_env: Mapping[str, str] | None = None) -> "Redactor":
        """Masks the secret-named variables of this process's environment and of ``comm.env``."""
        extra = [v for k, v in (comm_env or {}).items() if is_secret_name(k)]
        return cls(secret_values() + extra)

    def __call__(self, text: str) -> str:
        for v in self.values:
            text = text.replace(v, MASK)
        text = _URL_CREDENTIALS.sub(lambda m: f"{m['scheme']}{m['user']}:{MASK}@", text)
        text = _QUERY_TOKEN.sub(lambda m: m.group(1) + MASK, text)
        text = _SECRET_ASSIGN.sub(lambda m: m.group(1) + m.group(2) + MASK, text)
        return _HF_TOKEN.sub("hf_" + MASK, text)

    def mapping(self, obj: Any, key: str = "") -> Any:
        """A copy of a nested config with secret-named keys masked and every string redacted."""
        if isinstance(obj, dict):
            return {k: MASK if is_secret_name(str(k)) and isinstance(v, str) else self.mapping(v, str(k))
                    for k, v in obj.items()}
        if isinstance(obj, list):
            return [self.mapping(v, key) for v in obj]
        return self(obj) if isinstance(obj, str) else obj


class RedactingFilter(logging.Filter):
    """Attach to a handler: every record it writes is redacted."""

    def __init__(self, redactor: Redactor):
        super().__init__()
        self.redactor = redactor

    def filter(self, record: logging.LogRecord) -> bool:
        record.msg = self.redactor(record.getMessage())
        record.args = ()
        if record.exc_info and record.exc_info[1] is not None:
            import traceback

            record.msg += "\n" + self.redactor("".join(traceback.format_exception(*record.exc_info)))
            record.exc_info = None
        return True
