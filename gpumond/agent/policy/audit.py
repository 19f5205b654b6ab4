"""The policy audit log: the shared JSON-lines audit log (gpumond.auditlog)."""

from gpumond.auditlog import AuditLog

__all__ = ["AuditLog"]
