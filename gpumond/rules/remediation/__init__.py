"""Fleet remediation: confirmed node faults in, drains and returns to service out, behind a blast-radius guard.

faults.py (alerts and findings → node faults, pure) → plan.py (the lifecycle and the guard, pure) →
remediator.py (runs a plan against a backend, audits, persists, exports) → backends/ (Slurm, Kubernetes).
"""
