"""Keep secrets out of logs, config dumps, reports and error messages.

Masks the values of the environment's secret variables and of ``comm.env``'s (by name: HF_TOKEN, *_API_KEY,
*_SECRET*, AWS_*, ...; or by shape: see credentials.py), and, in any text, credential shapes (``Bearer ...``,
``hf_...``, ``sk-...``, ``ghp_...``, AWS key ids, JWTs), passwords in URLs (``https://user:TOKEN@host``),
token-like query parameters and ``KEY=value`` pairs whose key looks secret.
"""

from __future__ import annotations

import logging
import re
from typing import Any, Iterable, Mapping

from scaletrain.credentials import SHAPES, URL_CREDENTIALS, is_secret_name, looks_like_secret
from scaletrain.envvars import secret_values

MASK = "***"

_QUERY_TOKEN = re.compile(r"(?i)([?&](?:token|access_token|api_key|apikey|key|sig|signature|password)=)[^&\s]+")
_SECRET_ASSIGN = re.compile(
    # The key must end in the secret word ("eval/tokens" and "tokens_per_s" are metrics, not secrets).
    r"(?i)\b([A-Z0-9_]*(?:TOKEN|API_KEY|SECRET|PASSWORD|ACCESS_KEY)(?:_KEY)?)(?![A-Za-z0-9])"
    r"(['\"]?\s*[=:]\s*['\"]?)([^\s'\",;}&]+)")


class Redactor:
    def __init__(self, secret_values: Iterable[str] = ()):
        # Longest first, so a secret that contains another is masked whole.
        self.values = sorted({v for v in secret_values if v}, key=len, reverse=True)

    @classmethod
    def from_environment(cls, comm_env: Mapping[str, str] | None = None) -> "Redactor":
        """Masks the secret variables of this process's environment and of ``comm.env``."""
        extra = [v for k, v in (comm_env or {}).items() if looks_like_secret(k, v)]
        return cls(secret_values() + extra)

    def __call__(self, text: str) -> str:
        for v in self.values:
            text = text.replace(v, MASK)
        text = URL_CREDENTIALS.sub(lambda m: f"{m['scheme']}{m['user']}:{MASK}@", text)
        text = _QUERY_TOKEN.sub(lambda m: m.group(1) + MASK, text)
        text = _SECRET_ASSIGN.sub(lambda m: m.group(1) + m.group(2) + MASK, text)
        for shape in SHAPES.values():
            text = shape.sub(MASK, text)
        return text

    def mapping(self, obj: Any, key: str = "") -> Any:
        """A copy of a nested config with every string redacted, and the whole value of a secret key masked (by
        its name, or when its value looks like a credential that redacting the text would not hide)."""
        if isinstance(obj, dict):
            return {k: MASK if isinstance(v, str) and self._whole_secret(str(k), v) else self.mapping(v, str(k))
                    for k, v in obj.items()}
        if isinstance(obj, list):
            return [self.mapping(v, key) for v in obj]
        return self(obj) if isinstance(obj, str) else obj

    def _whole_secret(self, key: str, value: str) -> bool:
        return is_secret_name(key) or (looks_like_secret(key, value) and self(value) == value)


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
