"""gpumond: GPU-fleet telemetry, thermal management and straggler detection."""

__version__ = "0.1.0"
