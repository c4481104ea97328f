"""Run deploy/nginx.conf (Debian's nginx) in front of local replicas, for tests and benches."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
SNIPPET = ROOT / "deploy" / "nginx.conf"


def nginx_binary() -> str | None:
    return shutil.which("nginx") or next(
        (p for p in ("/usr/sbin/nginx", "/usr/local/sbin/nginx") if os.path.exists(p)), None)


@dataclass
class NginxProxy:
    proc: subprocess.Popen[bytes]
    port: int
    prefix: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def log(self) -> str:
        return (self.prefix / "error.log").read_text(errors="replace")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def start_nginx(prefix: Path, port: int, upstreams: list[int]) -> NginxProxy:
    """deploy/nginx.conf with its example replicas and port replaced, inside a minimal
    main config (foreground, files under ``prefix``)."""
    binary = nginx_binary()
    if binary is None:
        raise RuntimeError("nginx is not installed (apt-get install nginx)")
    prefix.mkdir(parents=True, exist_ok=True)
    text = SNIPPET.read_text()
    servers = "".join(f"    server 127.0.0.1:{p} max_fails=1 fail_timeout=10s;\n"
                      for p in upstreams)
    text, n = re.subn(r"(    server 127\.0\.0\.1:\d+ [^\n]*\n)+", servers, text)
    assert n == 1, "deploy/nginx.conf: the upstream's server lines moved"
    text, n = re.subn(r"listen 8080;", f"listen 127.0.0.1:{port};", text)
    assert n == 1, "deploy/nginx.conf: the listen line moved"
    (prefix / "llamaserve.conf").write_text(text)
    user = "user root;\n" if os.geteuid() == 0 else ""
    (prefix / "nginx.conf").write_text(f"""{user}daemon off;
worker_processes 1;
pid {prefix}/nginx.pid;
error_log {prefix}/error.log info;
events {{ worker_connections 1024; }}
http {{
    access_log {prefix}/access.log;
    client_body_temp_path {prefix}/body;
    proxy_temp_path {prefix}/proxy;
    fastcgi_temp_path {prefix}/fastcgi;
    uwsgi_temp_path {prefix}/uwsgi;
    scgi_temp_path {prefix}/scgi;
    include {prefix}/llamaserve.conf;
}}
""")
    proc = subprocess.Popen([binary, "-p", str(prefix), "-c", str(prefix / "nginx.conf")],
                            stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    proxy = NginxProxy(proc, port, prefix)
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"nginx exited with {proc.returncode}:\n{proxy.log()}")
        try:
            httpx.get(f"{proxy.url}/healthz", timeout=2)
            return proxy
        except httpx.HTTPError:
            time.sleep(0.1)
    proxy.stop()
    raise RuntimeError(f"nginx did not start:\n{proxy.log()}")
