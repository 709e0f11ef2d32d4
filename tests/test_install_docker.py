"""docker-compose.yml and the Dockerfile name only commands, options and settings that exist (docker itself is not
available to the tests): the compose file parses, every RESEARCH_AGENT_* variable is a setting, the server command
parses with the real CLI and its settings pass the HTTP exposure check, and the Chroma service's command and
health check work against a real `chroma run`."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from research_agent.config import Settings

ROOT = Path(__file__).resolve().parents[1]
COMPOSE = yaml.safe_load((ROOT / "docker-compose.yml").read_text(encoding="utf-8"))
DOCKERFILE = (ROOT / "Dockerfile").read_text(encoding="utf-8")
BIN = Path(sys.executable).parent
A_KEY = "k" * 40  # what `${RESEARCH_AGENT_API_KEYS:?...}` is replaced with when the user exports a key


def _service(name: str) -> dict:
    return COMPOSE["services"][name]


def _environment(name: str) -> dict[str, str]:
    env = {k: str(v) for k, v in _service(name).get("environment", {}).items()}
    return {k: (A_KEY if v.startswith("${RESEARCH_AGENT_API_KEYS") else v) for k, v in env.items()}


def test_the_compose_file_has_the_server_and_chroma_and_names_real_settings():
    assert set(COMPOSE["services"]) == {"research-agent", "chroma"}
    env = _environment("research-agent")
    unknown = {k for k in env if k.startswith("RESEARCH_AGENT_")
               and k.removeprefix("RESEARCH_AGENT_").lower() not in Settings.model_fields}
    assert not unknown, f"not settings: {unknown}"
    assert env["RESEARCH_AGENT_CHROMA_HOST"] == "chroma"  # the service name is the host inside the network
    assert set(COMPOSE["volumes"]) >= {v.split(":")[0] for v in _service("chroma")["volumes"]}


def test_the_server_command_parses_and_its_settings_would_be_served():
    """The command's options exist (the real CLI parses them) and the environment passes the check that refuses
    to serve a non-loopback address without a key."""
    from research_agent.mcp.auth import check_http_settings

    command = _service("research-agent")["command"]
    assert command == re.findall(r'"([^"]+)"', DOCKERFILE.split("CMD", 1)[1].splitlines()[0])  # one command
    done = subprocess.run([str(BIN / command[0]), *command[1:], "--help"], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    options = dict(zip(command[2::2], command[3::2]))
    env = _environment("research-agent")
    settings = Settings(transport=options["--transport"], host=options["--host"], port=int(options["--port"]),
                        **{k.removeprefix("RESEARCH_AGENT_").lower(): v for k, v in env.items()})
    assert check_http_settings(settings) == ("bearer", [A_KEY])
    published = _service("research-agent")["ports"][0]
    assert published.startswith("127.0.0.1:") and published.endswith(f":{settings.port}")


def test_the_dockerfile_copies_what_exists_and_pins_the_setup_torch():
    for line in DOCKERFILE.splitlines():
        if line.startswith("COPY "):
            for source in line.split()[1:-1]:
                assert (ROOT / source).exists(), source
    setup_torch = re.search(r"^TORCH_VERSION=(\S+)", (ROOT / "scripts" / "setup.sh").read_text(), re.M).group(1)
    assert f"ARG TORCH_VERSION={setup_torch}" in DOCKERFILE
    assert "'/health'" in (ROOT / "research_agent" / "mcp" / "server.py").read_text().replace('"', "'")


def test_the_chroma_command_and_health_check_work_against_a_real_chroma(tmp_path):
    from conftest import free_port

    exe = shutil.which("chroma") or str(BIN / "chroma")
    if not Path(exe).exists():
        pytest.skip("the `chroma` executable is missing (pip install chromadb provides it)")
    port = str(free_port())
    command = [{"/data": str(tmp_path / "data"), "8000": port, "0.0.0.0": "127.0.0.1"}.get(a, a)
               for a in _service("chroma")["command"]]
    check = [a.replace(":8000/", f":{port}/") for a in _service("chroma")["healthcheck"]["test"][1:]]
    server = subprocess.Popen([exe, *command[1:]], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60  # a bound to catch a hang; it starts in about a second
        while True:
            healthy = subprocess.run([sys.executable if check[0] == "python" else check[0], *check[1:]],
                                     capture_output=True, timeout=30, env={**os.environ})
            if healthy.returncode == 0 or time.monotonic() > deadline:
                break
            time.sleep(0.3)
        assert healthy.returncode == 0, healthy.stderr.decode()[-500:]
    finally:
        server.kill()
        server.wait()
