"""How a secret is shown: its fingerprint, the same on both sides of the seam.

The server reports the fingerprint of the credential a turn ran on
(`metadata.fingerprint`) and of the one it holds (`/api/credentials/status`); the
controller tells by it which credential of its pool that was.
"""

from __future__ import annotations

import hashlib

from pydantic import SecretStr


def fingerprint(secret: SecretStr | str) -> str:
    """`sha256:` + the first 12 hex digits of the secret's sha256 (safe to show)."""
    value = secret.get_secret_value() if isinstance(secret, SecretStr) else secret
    return "sha256:" + hashlib.sha256(value.encode()).hexdigest()[:12]
