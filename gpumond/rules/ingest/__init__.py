"""Push ingest: payload validation, bearer auth, rate limits and the acceptance logic behind POST /api/v1/push."""

from gpumond.rules.ingest.accept import Client, Ingest, Reply
from gpumond.rules.ingest.auth import AuthResult, TokenAuth
from gpumond.push.body import PayloadError, PushBody, Step, columns_model, parse, push_model
from gpumond.rules.ingest.ratelimit import RateLimiter
from gpumond.rules.ingest.stats import INGEST_METRICS, IngestStats

__all__ = [
    "INGEST_METRICS",
    "AuthResult",
    "Client",
    "Ingest",
    "IngestStats",
    "PayloadError",
    "PushBody",
    "Step",
    "RateLimiter",
    "Reply",
    "TokenAuth",
    "columns_model",
    "parse",
    "push_model",
]
