"""The Prometheus HTTP API client of the passive source: the only I/O of ``healthd.passive`` with ``source.py``.

One ``POST /api/v1/query`` per call (form-encoded, so a long query is no long URL), with Prometheus's own
``timeout`` parameter, a whole-answer deadline (a server that drips its answer is cut off), TLS as
Prometheus's ``tls_config`` has it, basic auth or a bearer token read from their files at each call, no
proxy from the environment, and a capped read: an answer longer than ``max_response_bytes`` is an error,
not read further. Every failure is a ``PassiveQueryError`` naming it.
"""

from __future__ import annotations

import base64
import http.client
import json
import socket
import ssl
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

from healthd.config import PassiveSettings

READ_CHUNK = 64 * 1024


class PassiveQueryError(Exception):
    """A query that gave no usable answer (network, TLS, HTTP status, timeout, size, auth file)."""


def _secret(path: Path, what: str) -> str:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise PassiveQueryError(f"cannot read the {what} {path}: {getattr(exc, 'strerror', None) or exc}") from None
    return text.strip()


class PrometheusClient:
    """Instant queries against ``settings.prometheus_url``."""

    def __init__(self, settings: PassiveSettings) -> None:
        if settings.prometheus_url is None:
            raise ValueError("passive.prometheus_url is not set")
        self.settings = settings
        self.url = f"{settings.prometheus_url}/api/v1/query"
        self._context: ssl.SSLContext | None = None

    def _tls(self) -> ssl.SSLContext:
        if self._context is None:
            tls = self.settings.tls
            try:
                context = ssl.create_default_context(cafile=str(tls.ca_file) if tls.ca_file else None)
                if tls.cert_file is not None and tls.key_file is not None:
                    context.load_cert_chain(str(tls.cert_file), str(tls.key_file))
            except (OSError, ssl.SSLError) as exc:
                raise PassiveQueryError(f"TLS setup: {exc}") from None
            if tls.insecure_skip_verify:
                context.check_hostname = False
                context.verify_mode = ssl.CERT_NONE
            self._context = context
        return self._context

    def headers(self) -> dict[str, str]:
        """The request's headers, with the credentials read now (a rotated file is picked up)."""
        s = self.settings
        headers = {"Accept": "application/json", "Content-Type": "application/x-www-form-urlencoded",
                   "User-Agent": "healthd-passive"}
        if s.username is not None and s.password_file is not None:
            password = _secret(s.password_file, "password_file")
            token = base64.b64encode(f"{s.username}:{password}".encode()).decode("ascii")
            headers["Authorization"] = f"Basic {token}"
        elif s.bearer_token_file is not None:
            headers["Authorization"] = f"Bearer {_secret(s.bearer_token_file, 'bearer_token_file')}"
        return headers

    def query(self, promql: str) -> bytes:
        """The raw answer (JSON bytes) of one instant query.

        :raises PassiveQueryError: no answer within ``timeout_s``, a connection or TLS error, an HTTP
            status other than 200 (with Prometheus's error text when it sent one), an answer over
            ``max_response_bytes``, an unreadable credentials file.
        """
        s = self.settings
        body = urllib.parse.urlencode({"query": promql, "timeout": f"{s.timeout_s:g}s"}).encode()
        handlers: list[urllib.request.BaseHandler] = [urllib.request.ProxyHandler({})]
        if self.url.startswith("https:"):
            handlers.append(urllib.request.HTTPSHandler(context=self._tls()))
        opener = urllib.request.build_opener(*handlers)
        request = urllib.request.Request(self.url, data=body, headers=self.headers(), method="POST")
        deadline = time.monotonic() + s.timeout_s
        try:
            with opener.open(request, timeout=s.timeout_s) as response:
                return self._read(response, deadline)
        except urllib.error.HTTPError as exc:
            raise PassiveQueryError(self._http_error(exc)) from None
        except urllib.error.URLError as exc:
            reason = exc.reason
            if isinstance(reason, TimeoutError | socket.timeout):
                raise PassiveQueryError(f"no answer within {s.timeout_s:g} s") from None
            raise PassiveQueryError(f"cannot reach {s.prometheus_url}: {reason}") from None
        except TimeoutError:
            raise PassiveQueryError(f"no answer within {s.timeout_s:g} s") from None
        except (OSError, http.client.HTTPException, ValueError) as exc:
            raise PassiveQueryError(f"{type(exc).__name__}: {exc}"[:300]) from None

    def _read(self, response: http.client.HTTPResponse, deadline: float) -> bytes:
        limit = self.settings.max_response_bytes
        length = response.headers.get("Content-Length")
        if length is not None and length.isdigit() and int(length) > limit:
            raise PassiveQueryError(f"answer of {int(length)} bytes, more than passive.max_response_bytes ({limit})")
        chunks: list[bytes] = []
        total = 0
        while True:
            if time.monotonic() > deadline:
                raise PassiveQueryError(f"no complete answer within {self.settings.timeout_s:g} s")
            chunk = response.read1(READ_CHUNK)
            if not chunk:
                return b"".join(chunks)
            total += len(chunk)
            if total > limit:
                raise PassiveQueryError(f"answer longer than passive.max_response_bytes ({limit})")
            chunks.append(chunk)

    def _http_error(self, exc: urllib.error.HTTPError) -> str:
        text = f"HTTP {exc.code} {exc.reason}"
        try:
            doc = json.loads(exc.read(64 * 1024))
            if isinstance(doc, dict) and doc.get("error"):
                text += f": {str(doc['error'])[:300]}"
        except Exception:  # the status is the error; its body is a courtesy
            pass
        return text
