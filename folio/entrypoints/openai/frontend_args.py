"""FrontendConfig: the server flags vLLM's `serve` has beside folio's own (CORS, TLS, root path,
request logging, metric names, docs), with vLLM's flag names and defaults.
"""

from __future__ import annotations

import argparse
import json
import os
from dataclasses import dataclass

from folio.logger import init_logger

logger = init_logger(__name__)

METRICS_COMPAT = ("vllm", "none")
CERT_REQS = (0, 1, 2)  # ssl.CERT_NONE, ssl.CERT_OPTIONAL, ssl.CERT_REQUIRED


def _json_list(text: str) -> list[str]:
    """vLLM's CORS flags take JSON lists: '["*"]'."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"not a JSON list: {text!r} ({e})") from None
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ValueError(f"not a JSON list of strings: {text!r}")
    return value


_json_list.__name__ = "JSON list"


@dataclass(frozen=True)
class FrontendConfig:
    root_path: str = ""  # the path prefix a proxy serves the API under (ASGI root_path)
    allowed_origins: tuple[str, ...] = ("*",)
    allowed_methods: tuple[str, ...] = ("*",)
    allowed_headers: tuple[str, ...] = ("*",)
    allow_credentials: bool = False
    ssl_keyfile: str | None = None
    ssl_certfile: str | None = None
    ssl_ca_certs: str | None = None
    ssl_cert_reqs: int = 0  # vLLM's: the ssl module's CERT_NONE (0), CERT_OPTIONAL (1), CERT_REQUIRED (2)
    enable_log_requests: bool = False  # one log line per request (prompt cut to max_log_len)
    max_log_len: int | None = None
    metrics_compat: str = "vllm"  # also export vLLM's metric names ("none": folio's only)
    disable_fastapi_docs: bool = False
    response_role: str = "assistant"
    # One /v1/embeddings (/score, /rerank) request's caps: OpenAI's, so one call cannot ask for
    # minutes of engine work; a batch job that wants more raises them (vLLM has no cap).
    max_embedding_inputs: int = 2048
    max_embedding_tokens: int = 300_000

    def __post_init__(self) -> None:
        if (self.ssl_keyfile is None) != (self.ssl_certfile is None):
            raise ValueError("--ssl-keyfile and --ssl-certfile go together: pass both or neither.")
        for name in ("ssl_keyfile", "ssl_certfile", "ssl_ca_certs"):
            path = getattr(self, name)
            if path is not None and not os.path.isfile(path):
                raise ValueError(f"--{name.replace('_', '-')} {path!r} is not a file.")
        self._check_client_certs()
        if self.metrics_compat not in METRICS_COMPAT:
            raise ValueError(f"--metrics-compat must be one of {METRICS_COMPAT}, got {self.metrics_compat!r}.")
        if self.max_log_len is not None and self.max_log_len < 0:
            raise ValueError(f"--max-log-len must be non-negative, got {self.max_log_len}.")
        if self.max_log_len is not None and not self.enable_log_requests:
            logger.warning("--max-log-len is unused without --enable-log-requests (no request is logged).")
        for name in ("max_embedding_inputs", "max_embedding_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"--{name.replace('_', '-')} must be at least 1, got {getattr(self, name)}.")
        if self.response_role != "assistant":
            raise ValueError(f"--response-role {self.response_role!r}: folio answers as 'assistant' only.")

    def _check_client_certs(self) -> None:
        """--ssl-ca-certs and --ssl-cert-reqs act on TLS only. Asking clients for certificates
        needs a CA to check them against; a CA file without --ssl-cert-reqs checks nobody."""
        if self.ssl_cert_reqs not in CERT_REQS:
            raise ValueError(f"--ssl-cert-reqs must be 0 (none), 1 (optional) or 2 (required), got {self.ssl_cert_reqs!r}.")
        if self.ssl_ca_certs is not None and self.ssl_certfile is None:
            raise ValueError("--ssl-ca-certs needs --ssl-keyfile and --ssl-certfile (it only applies to TLS).")
        if self.ssl_cert_reqs and self.ssl_ca_certs is None:
            raise ValueError(f"--ssl-cert-reqs {self.ssl_cert_reqs} needs --ssl-ca-certs: the CA certificates "
                             "that client certificates are checked against.")
        if self.ssl_ca_certs is not None and not self.ssl_cert_reqs:
            logger.warning("--ssl-ca-certs: client certificates are not requested, so none is checked; pass "
                           "--ssl-cert-reqs 2 to require one (1: check one if sent).")

    def check_tls(self) -> None:
        """Load the TLS key and certificate as uvicorn will (a file that is not PEM, a key that
        does not match its certificate): a flag error before the engine starts, not after."""
        if self.ssl_certfile is None:
            return
        import ssl

        from uvicorn.config import SSL_PROTOCOL_VERSION, create_ssl_context

        try:
            create_ssl_context(certfile=self.ssl_certfile, keyfile=self.ssl_keyfile, password=None,
                               ssl_version=SSL_PROTOCOL_VERSION, cert_reqs=self.ssl_cert_reqs,
                               ca_certs=self.ssl_ca_certs, ciphers=None)
        except (ssl.SSLError, OSError) as e:
            raise tls_error(e) from None

    @classmethod
    def from_cli_args(cls, args: argparse.Namespace) -> FrontendConfig:
        d = cls()
        return cls(
            root_path=getattr(args, "root_path", d.root_path) or "",
            allowed_origins=tuple(getattr(args, "allowed_origins", d.allowed_origins)),
            allowed_methods=tuple(getattr(args, "allowed_methods", d.allowed_methods)),
            allowed_headers=tuple(getattr(args, "allowed_headers", d.allowed_headers)),
            allow_credentials=getattr(args, "allow_credentials", d.allow_credentials),
            ssl_keyfile=getattr(args, "ssl_keyfile", None),
            ssl_certfile=getattr(args, "ssl_certfile", None),
            ssl_ca_certs=getattr(args, "ssl_ca_certs", None),
            ssl_cert_reqs=getattr(args, "ssl_cert_reqs", d.ssl_cert_reqs),
            enable_log_requests=getattr(args, "enable_log_requests", d.enable_log_requests),
            max_log_len=getattr(args, "max_log_len", None),
            metrics_compat=getattr(args, "metrics_compat", d.metrics_compat),
            disable_fastapi_docs=getattr(args, "disable_fastapi_docs", d.disable_fastapi_docs),
            response_role=getattr(args, "response_role", d.response_role),
            max_embedding_inputs=getattr(args, "max_embedding_inputs", d.max_embedding_inputs),
            max_embedding_tokens=getattr(args, "max_embedding_tokens", d.max_embedding_tokens),
        )


def tls_error(error: Exception) -> ValueError:
    """What a TLS key and certificate that cannot be loaded is (the same wherever it shows)."""
    return ValueError(f"--ssl-keyfile/--ssl-certfile: cannot load the TLS key and certificate: {error}")


def add_frontend_args(group: argparse._ArgumentGroup) -> None:
    d = FrontendConfig()
    group.add_argument("--root-path", default=d.root_path, help="path prefix when behind a proxy")
    group.add_argument("--allowed-origins", type=_json_list, default=list(d.allowed_origins),
                       help='CORS: allowed origins, a JSON list (default ["*"])')
    group.add_argument("--allowed-methods", type=_json_list, default=list(d.allowed_methods),
                       help="CORS: allowed methods, a JSON list")
    group.add_argument("--allowed-headers", type=_json_list, default=list(d.allowed_headers),
                       help="CORS: allowed headers, a JSON list")
    group.add_argument("--allow-credentials", action="store_true", help="CORS: allow credentials")
    group.add_argument("--ssl-keyfile", default=None, help="TLS key file (with --ssl-certfile)")
    group.add_argument("--ssl-certfile", default=None, help="TLS certificate file")
    group.add_argument("--ssl-ca-certs", default=None, help="CA certificates to verify clients against")
    group.add_argument("--ssl-cert-reqs", type=int, default=d.ssl_cert_reqs,
                       help="client certificates: 0 not asked for (default), 1 checked if sent, 2 required "
                            "(the ssl module's CERT_NONE/CERT_OPTIONAL/CERT_REQUIRED; needs --ssl-ca-certs)")
    group.add_argument("--enable-log-requests", action="store_true",
                       help="log each request: id, prompt (cut to --max-log-len) and sampling parameters")
    group.add_argument("--disable-log-requests", action="store_false", dest="enable_log_requests", default=False,
                       help="no request log lines (the default; vLLM's older flag)")
    group.add_argument("--max-log-len", type=int, default=None,
                       help="characters (and token ids) of each prompt in request logs (default: all)")
    group.add_argument("--metrics-compat", default=d.metrics_compat, choices=METRICS_COMPAT,
                       help="/metrics also exports vLLM's names (vllm:...) so vLLM dashboards work")
    group.add_argument("--disable-fastapi-docs", action="store_true", help="no /docs, /redoc, /openapi.json")
    group.add_argument("--response-role", default=d.response_role, help="role of chat answers (assistant only)")
    group.add_argument("--max-embedding-inputs", type=int, default=d.max_embedding_inputs,
                       help="inputs one /v1/embeddings request may send (pairs or documents for /score, /rerank)")
    group.add_argument("--max-embedding-tokens", type=int, default=d.max_embedding_tokens,
                       help="tokens over all inputs of one embeddings/score/rerank request "
                            "(at least max_model_len is always taken)")
