"""`gpumond demo`: a whole simulated cluster on this machine, with planted faults and live findings."""
