"""`gpumond health-check` off a Slurm node: one line saying what it needs, exit 1, nothing touched."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path


def test_a_dry_run_where_sinfo_fails_says_it_needs_a_slurm_node(tmp_path: Path) -> None:
    class Agent(BaseHTTPRequestHandler):  # an agent with nothing firing
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            body = b"# TYPE gpumond_gpu_up gauge\n"
            self.send_response(200)
            self.send_header("Content-Type", "text/plain")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    sinfo = bin_dir / "sinfo"  # what sinfo says on a machine with no slurm.conf
    sinfo.write_text("#!/bin/sh\necho 'sinfo: fatal: Could not establish a configuration source' >&2\nexit 1\n")
    sinfo.chmod(0o755)
    server = ThreadingHTTPServer(("127.0.0.1", 0), Agent)
    server.timeout = 5
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        done = subprocess.run(
            [sys.executable, "-m", "gpumond.cli", "health-check", "--node", "node-a",
             "--agent", f"http://127.0.0.1:{server.server_address[1]}", "--state-dir", str(tmp_path / "state")],
            capture_output=True, text=True, timeout=60,
            env={**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"})
    finally:
        server.shutdown()
        server.server_close()
    assert done.returncode == 1, done
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert "Could not establish a configuration source" in lines[0]
    assert "it runs on a Slurm node" in lines[0] and "SLURM_CONF" in lines[0]
    assert not (tmp_path / "state").exists()  # nothing kept: it stopped before acting
