"""The policy audit log: the shared JSON-lines audit log (gpumond.state.audit)."""

from gpumond.state.audit import AuditLog

__all__ = ["AuditLog"]
