"""Sensitive fields sealed at rest (English seed §12, Chinese seed §4, §12).

A field whose key is in :data:`SENSITIVE` is stored, wherever it goes in the
database (a run's input, checkpoint state, a ledger request body), as
``{"$sealed": "v1:<base64 of nonce + AES-256-GCM ciphertext>"}`` under the
key in ``FENCECHECK_DATA_KEY`` (base64 of 32 bytes; AES-GCM as Go's
crypto/cipher has it). The database and its backups never see the value;
the dispatcher opens a request just before it goes to the tool, which must
receive the value itself. Digests are over the opened request (what the
tool computes too), so they stay stable although every sealing differs.

Invariants: a sensitive value never reaches the database unsealed (without
a key the worker refuses it: SensitiveDataWithoutKey) and never reaches a
log (no log line carries a request, a state or an input).
"""

from __future__ import annotations

import base64
import binascii
import os
from typing import Any

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from reference_impl import errors as e

#: Keys whose values are sealed wherever they appear (nested objects included).
SENSITIVE = frozenset({"customer_token", "payment_token", "card_number", "customer_email"})
_MARK = "$sealed"
_VERSION = "v1:"


def key_from(text: str | None) -> bytes | None:
    """The 32-byte key from its base64 form (None when not configured)."""
    if not text:
        return None
    try:
        key = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise ValueError("FENCECHECK_DATA_KEY must be base64 of 32 bytes") from exc
    if len(key) != 32:
        raise ValueError(f"FENCECHECK_DATA_KEY must be 32 bytes, got {len(key)}")
    return key


class Sealer:
    """Seals and opens the sensitive fields of JSON values."""

    def __init__(self, key: bytes | None) -> None:
        self._aead = AESGCM(key) if key is not None else None

    def seal(self, value: Any) -> Any:
        """``value`` with every sensitive field sealed (already sealed ones kept).

        An object that names the sealed mark is kept only when it is a sealed
        value of this worker's form (the one key, a token that opens under the
        key, when there is one); any other is refused (ValueError): an input
        could otherwise pass a clear value off as sealed, or hide one beside
        the mark, and have it stored in clear."""
        if isinstance(value, dict):
            if _MARK in value:
                self._genuine(value)
                return value
            return {
                k: self._seal_one(v) if k in SENSITIVE else self.seal(v) for k, v in value.items()
            }
        if isinstance(value, list):
            return [self.seal(v) for v in value]
        return value

    def open(self, value: Any) -> Any:
        """``value`` with every sealed field opened."""
        if isinstance(value, dict):
            if _MARK in value and len(value) == 1:
                return self._open_one(str(value[_MARK]))
            return {k: self.open(v) for k, v in value.items()}
        if isinstance(value, list):
            return [self.open(v) for v in value]
        return value

    def _genuine(self, value: dict[str, Any]) -> None:
        """Refuse an object naming the mark that is no sealed value of ours.
        Without a key only the form can be judged (a worker without one still
        carries values sealed by another)."""
        token = value.get(_MARK)
        if len(value) != 1 or not isinstance(token, str) or not token.startswith(_VERSION):
            raise ValueError(f"an object naming {_MARK!r} must be a sealed value, nothing else")
        if self._aead is not None:
            try:
                self._open_one(token)
            except (ValueError, e.SensitiveDataWithoutKey) as exc:
                raise ValueError(f"a {_MARK!r} value that does not open under the key") from exc

    def _seal_one(self, value: Any) -> Any:
        if isinstance(value, dict) and _MARK in value:
            self._genuine(value)
            return value
        if self._aead is None:
            raise e.SensitiveDataWithoutKey()
        import json

        nonce = os.urandom(12)
        plain = json.dumps(value, sort_keys=True, separators=(",", ":")).encode()
        sealed = self._aead.encrypt(nonce, plain, None)
        return {_MARK: _VERSION + base64.b64encode(nonce + sealed).decode()}

    def _open_one(self, text: str) -> Any:
        if self._aead is None:
            raise e.SensitiveDataWithoutKey("a sealed field cannot be opened without the key")
        if not text.startswith(_VERSION):
            raise ValueError("unknown sealing version")
        raw = base64.b64decode(text[len(_VERSION) :])
        try:
            plain = self._aead.decrypt(raw[:12], raw[12:], None)
        except InvalidTag as exc:
            raise e.SensitiveDataWithoutKey("sealed with another key") from exc
        import json

        return json.loads(plain)
