"""TLS and basic auth for the HTTP endpoint, from a web config file in Prometheus exporter-toolkit's format.

``[http] web_config_file`` names a YAML file like the one ``node_exporter --web.config.file`` takes::

    tls_server_config:
      cert_file: /etc/healthd/tls.crt
      key_file: /etc/healthd/tls.key
    basic_auth_users:
      prometheus: $2b$12$...   # a bcrypt hash (htpasswd -nBC 12 "" | tr -d ':\\n')

Relative file names are relative to the web config file. Keys healthd does not implement are refused,
never ignored: a security setting that silently does nothing is worse than an error.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import ssl
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import bcrypt
import yaml

from healthd.errors import ConfigError

_TLS_KEYS = {"cert_file", "key_file", "client_ca_file", "client_auth_type", "min_version", "max_version"}
_CLIENT_AUTH = {
    "NoClientCert": ssl.CERT_NONE,
    "VerifyClientCertIfGiven": ssl.CERT_OPTIONAL,
    "RequireAndVerifyClientCert": ssl.CERT_REQUIRED,
}
_TLS_VERSIONS = {"TLS12": ssl.TLSVersion.TLSv1_2, "TLS13": ssl.TLSVersion.TLSv1_3}
_AUTH_CACHE_MAX = 256
MAX_WEB_CONFIG_BYTES = 1 << 20


@dataclass(frozen=True)
class TlsConfig:
    cert_file: Path
    key_file: Path
    client_ca_file: Path | None = None
    client_auth: ssl.VerifyMode = ssl.CERT_NONE
    min_version: ssl.TLSVersion = ssl.TLSVersion.TLSv1_2
    max_version: ssl.TLSVersion = ssl.TLSVersion.MAXIMUM_SUPPORTED

    def context(self) -> ssl.SSLContext:
        """A server context; :raises ConfigError: a certificate or key that cannot be loaded."""
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.minimum_version = self.min_version
        ctx.maximum_version = self.max_version
        try:
            ctx.load_cert_chain(self.cert_file, self.key_file)
            if self.client_ca_file is not None:
                ctx.load_verify_locations(cafile=self.client_ca_file)
        except (OSError, ssl.SSLError) as exc:
            raise ConfigError(f"web config: cannot load the TLS certificate or key: {exc}") from None
        ctx.verify_mode = self.client_auth
        return ctx


@dataclass(frozen=True)
class WebConfig:
    tls: TlsConfig | None = None
    users: dict[str, bytes] = field(default_factory=dict)
    """User name -> bcrypt hash."""


class BasicAuth:
    """Checks ``Authorization: Basic`` against bcrypt hashes; a verified (user, password) is remembered
    (as a SHA-256 digest) so that a scraper does not pay bcrypt's cost on every request."""

    def __init__(self, users: dict[str, bytes]) -> None:
        self._users = users
        self._ok: set[bytes] = set()
        self._lock = threading.Lock()

    def allows(self, header: str | None) -> bool:
        if not header or not header.startswith("Basic "):
            return False
        try:
            user, _, password = base64.b64decode(header[6:].strip(), validate=True).decode().partition(":")
        except (binascii.Error, UnicodeDecodeError):
            return False
        hashed = self._users.get(user)
        if hashed is None:
            return False
        key = hashlib.sha256(b"\0".join((user.encode(), password.encode(), hashed))).digest()
        with self._lock:
            if key in self._ok:
                return True
        try:
            ok = bcrypt.checkpw(password.encode(), hashed)
        except ValueError:
            return False
        if ok:
            with self._lock:
                if len(self._ok) >= _AUTH_CACHE_MAX:
                    self._ok.clear()
                self._ok.add(key)
        return ok


def load_web_config(path: Path) -> WebConfig:
    """:raises ConfigError: unreadable, not YAML, an unknown key, a hash that is not bcrypt, a bad TLS setting."""
    try:
        with path.open("rb") as fh:
            raw = fh.read(MAX_WEB_CONFIG_BYTES + 1)
    except OSError as exc:
        raise ConfigError(f"web config {path}: cannot read: {exc.strerror or exc}") from None
    if len(raw) > MAX_WEB_CONFIG_BYTES:
        raise ConfigError(f"web config {path}: larger than {MAX_WEB_CONFIG_BYTES} bytes")
    try:
        doc = yaml.safe_load(raw)
    except (yaml.YAMLError, RecursionError, UnicodeDecodeError) as exc:
        raise ConfigError(f"web config {path}: not valid YAML: {exc}") from None
    return parse_web_config(doc or {}, path.parent, str(path))


def parse_web_config(doc: Any, base: Path, source: str) -> WebConfig:
    if not isinstance(doc, dict):
        raise ConfigError(f"web config {source}: expected a mapping at the top level")
    unknown = sorted(set(doc) - {"tls_server_config", "basic_auth_users"})
    if unknown:
        raise ConfigError(f"web config {source}: unsupported key(s) {unknown}; healthd implements"
                          " tls_server_config and basic_auth_users")
    tls = _tls(doc.get("tls_server_config"), base, source) if doc.get("tls_server_config") is not None else None
    users_doc = doc.get("basic_auth_users") or {}
    if not isinstance(users_doc, dict):
        raise ConfigError(f"web config {source}: basic_auth_users must map user names to bcrypt hashes")
    users: dict[str, bytes] = {}
    for name, hashed in users_doc.items():
        if not isinstance(name, str) or not name or ":" in name:
            raise ConfigError(f"web config {source}: invalid user name {name!r}")
        if not isinstance(hashed, str) or not hashed.startswith(("$2a$", "$2b$", "$2y$")):
            raise ConfigError(f"web config {source}: the password of {name!r} is not a bcrypt hash ($2b$...)")
        users[name] = hashed.encode()
    return WebConfig(tls=tls, users=users)


def _tls(doc: Any, base: Path, source: str) -> TlsConfig:
    if not isinstance(doc, dict):
        raise ConfigError(f"web config {source}: tls_server_config must be a mapping")
    unknown = sorted(set(doc) - _TLS_KEYS)
    if unknown:
        raise ConfigError(f"web config {source}: unsupported tls_server_config key(s) {unknown};"
                          f" healthd implements {sorted(_TLS_KEYS)}")

    def path(key: str) -> Path | None:
        value = doc.get(key)
        if value is None or value == "":
            return None
        if not isinstance(value, str):
            raise ConfigError(f"web config {source}: tls_server_config.{key} must be a file name")
        return base / value

    cert, key = path("cert_file"), path("key_file")
    if cert is None or key is None:
        raise ConfigError(f"web config {source}: tls_server_config needs cert_file and key_file")
    auth_name = doc.get("client_auth_type") or "NoClientCert"
    if auth_name not in _CLIENT_AUTH:
        raise ConfigError(f"web config {source}: client_auth_type {auth_name!r} is not one of {sorted(_CLIENT_AUTH)}")
    client_ca = path("client_ca_file")
    if _CLIENT_AUTH[auth_name] != ssl.CERT_NONE and client_ca is None:
        raise ConfigError(f"web config {source}: client_auth_type {auth_name} needs client_ca_file")
    versions = {}
    for key_name, default in (("min_version", "TLS12"), ("max_version", "TLS13")):
        value = doc.get(key_name) or default
        if value not in _TLS_VERSIONS:
            raise ConfigError(f"web config {source}: {key_name} {value!r} is not one of {sorted(_TLS_VERSIONS)}")
        versions[key_name] = _TLS_VERSIONS[value]
    tls = TlsConfig(cert_file=cert, key_file=key, client_ca_file=client_ca, client_auth=_CLIENT_AUTH[auth_name],
                    min_version=versions["min_version"], max_version=versions["max_version"])
    tls.context()
    return tls
