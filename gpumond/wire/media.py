"""The push API's two encodings (docs/rules-api.md): their media types and the columnar encoding's fields.

The job SDK encodes with these names and the rules service decodes with them, so the two cannot drift apart.
"""

from __future__ import annotations

JSON_TYPE = "application/json"  # `steps`: a list of step objects, what every rules service version reads
COLUMNS_TYPE = "application/vnd.gpumond.columns+json"  # `columns`: one base64 array per field
# By the encoding's name, as GPUMOND_PUSH_ENCODING and the SDK's `encoding=` say it.
CONTENT_TYPES = {"json": JSON_TYPE, "columns": COLUMNS_TYPE}
ENCODINGS = tuple(CONTENT_TYPES)

# The columnar encoding's fields as (name, required): little-endian int64 arrays, then float64 arrays in the order
# the rules service stacks them. `samples` -1 is a step that did not count them and a NaN `comm_wait_s` one that
# did not measure it; a push in which no step has the value leaves the field out.
INT_FIELDS = (("step", True), ("samples", False))
FLOAT_FIELDS = (("end", True), ("duration_s", True), ("data_wait_s", True), ("comm_wait_s", False))
COLUMN_FIELDS = (*INT_FIELDS, *FLOAT_FIELDS)

# The batched push (docs/rules-api.md, "Batched pushes"): what the agent's node relay sends, many pushes of one job
# in one request. Lines separated by "\n": first the batch's head {"job": …, "pushes": N}, then N columnar push
# bodies (COLUMNS_TYPE's shape, each of that job), each judged by the service as if it had been pushed alone.
BATCH_TYPE = "application/vnd.gpumond.batch+jsonl"
# The columnar batch (docs/rules-api.md, "Batched pushes"; gpumond/wire/batch.py): what the relay sends. One JSON
# object: the job, each push's identity as arrays, and one set of step columns for all of the batch's pushes.
BATCH_COLUMNS_TYPE = "application/vnd.gpumond.batch-columns+json"
# Sent by the job SDK to the node relay only: the pushing process's id as it sees it, so the agent can find the GPU
# that process runs on. A header, not a body field: it describes the sender, and a push to the service is unchanged.
PID_HEADER = "Gpumond-Pid"
# Sent with it: the process's start time (clock ticks since boot, gpumond/wire/procstat.py), so a pid that other
# containers also use names one process. A header of its own: a relay that predates it reads Gpumond-Pid as before.
PID_START_HEADER = "Gpumond-Pid-Start"
# Sent by the job SDK to the node relay only, as "1", on a push it makes at once after a step that stood out (an early
# push, gpumond/job/early.py): the relay then forwards that job's held pushes at once instead of at its next interval.
# A header, not a body field: it describes the push's occasion to the relay, and a push to the service is unchanged.
EARLY_HEADER = "Gpumond-Early"
