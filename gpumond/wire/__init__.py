"""The contract between the job SDK and the rules service, in one place both import.

Device UUIDs and job ids (`identity`), which shard owns a job (`routing`), the push API's media types and the
columnar encoding's field order (`media`), the batched push's framing (`batch`), when to send a request again (`retry`), the client side of TLS
(`tlsclient`) and one-line, terminal-safe text (`safetext`). Standard library only, and importing nothing else of
gpumond: the job SDK ships it in the dependency-free `gpumond-job` distribution, inside training images.
"""
