"""What no machine here can run, read from the files that ship: the GPU image's llama.cpp loads its CUDA
backend at run time (so its binaries start without a driver, as the build's smoke step needs), the CPU
twin differs from it only in build arguments, and compose.yaml is the README's `docker run` line."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = (ROOT / "Dockerfile").read_text()
BUILD_CPU_IMAGE = (ROOT / "scripts" / "build-cpu-image").read_text()


def instructions() -> list[str]:
    """The Dockerfile's instructions, continuation lines joined, comments dropped."""
    joined = re.sub(r"\\\n", " ", "\n".join(line for line in DOCKERFILE.splitlines() if not line.startswith("#")))
    return [line.strip() for line in joined.splitlines() if line.strip()]


def arg_defaults() -> dict[str, str]:
    found: dict[str, str] = {}
    for line in instructions():
        if line.startswith("ARG ") and "=" in line:
            name, value = line[4:].split("=", 1)
            found[name] = shlex.split(value)[0] if value else ""
    return found


def final_stage() -> list[str]:
    lines = instructions()
    last_from = max(i for i, line in enumerate(lines) if line.startswith("FROM "))
    return lines[last_from:]


def test_the_gpu_image_builds_llama_cpp_with_cuda_loaded_at_run_time() -> None:
    args = arg_defaults()
    cmake = args["LLAMA_CPP_CMAKE_ARGS"].split()
    assert "-DGGML_CUDA=on" in cmake
    assert "-DGGML_BACKEND_DL=ON" in cmake  # libggml-cuda.so is dlopen'ed, not linked into llama-server
    assert args["LLAMA_BUILD_IMAGE"].startswith("nvidia/cuda:") and "-devel-" in args["LLAMA_BUILD_IMAGE"]
    assert args["BASE_IMAGE"].startswith("vllm/vllm-openai:")
    compile_step = next(line for line in instructions() if "cmake -S . -B build" in line)
    assert "${LLAMA_CPP_CMAKE_ARGS}" in compile_step


def test_the_gpu_image_starts_its_binaries_at_build_time_without_a_driver() -> None:
    """The smoke step runs in the final stage on a builder without a GPU: it can pass only when the CUDA
    backend is loaded lazily, and the driver's libcuda.so.1 is the one library allowed to be missing."""
    smoke = next(line for line in final_stage() if line.startswith("RUN llama-server --version"))
    assert "ggml-rpc-server --help" in smoke
    assert '/not found/ && $1 != "libcuda.so.1"' in smoke
    copy = next(line for line in instructions() if "xargs -r cp -L -t /opt/llama.cpp/bin/" in line)
    assert "libcuda" in copy  # the driver's library is never copied into the image


def test_the_cpu_twin_is_the_same_dockerfile_with_other_build_arguments() -> None:
    build = next(line for line in BUILD_CPU_IMAGE.splitlines() if "podman build" in line)
    assert build.split()[-1] == "." and " -f " not in build and "--file" not in build  # ./Dockerfile itself
    given = set(re.findall(r'--build-arg "([A-Z_]+)=', BUILD_CPU_IMAGE))
    declared = set(arg_defaults())
    assert {"BASE_IMAGE", "LLAMA_BUILD_IMAGE", "LLAMA_CPP_CMAKE_ARGS"} <= given
    assert given <= declared, given - declared
    contexts = set(re.findall(r'--build-context "([a-z-]+)=', BUILD_CPU_IMAGE))
    stages = set(re.findall(r"^FROM \S+ AS (\S+)$", DOCKERFILE, re.MULTILINE))
    assert contexts <= stages, contexts - stages  # a named context replaces a stage that is empty by default


def test_build_secrets_are_mounted_never_copied() -> None:
    """A proxy's CA reaches pip during the build as a secret, which no layer keeps."""
    pip_steps = [line for line in instructions() if "pip download" in line or "pip install --no-cache-dir /opt" in line]
    assert len(pip_steps) == 2
    for step in pip_steps:
        assert "--mount=type=secret,id=ca-bundle,required=false" in step
    assert not any(line.startswith(("COPY", "ADD")) and "ca-" in line for line in instructions())


def test_compose_runs_what_the_image_exposes_with_the_gpus_and_shared_memory() -> None:
    compose = yaml.safe_load((ROOT / "compose.yaml").read_text())
    service = compose["services"]["gateway"]
    exposed = next(line.split()[1] for line in final_stage() if line.startswith("EXPOSE"))
    assert [port.split(":")[-1] for port in service["ports"]] == [exposed]
    volumes = re.search(r"^VOLUME (\[.*\])$", DOCKERFILE, re.MULTILINE)
    assert volumes
    assert {mount.split(":")[-1] for mount in service["volumes"]} == set(yaml.safe_load(volumes.group(1)))
    assert service["ipc"] == "host"
    device = service["deploy"]["resources"]["reservations"]["devices"][0]
    assert device["driver"] == "nvidia" and device["count"] == "all" and device["capabilities"] == ["gpu"]
    # the drain (shutdown_grace_s) and the engine's stop must fit before the runtime kills
    from gateway.cli.startup import ENGINE_TERM_WAIT_S
    from gateway.core.settings import Settings

    grace = Settings.model_fields["shutdown_grace_s"].default
    assert int(service["stop_grace_period"].rstrip("s")) > grace + ENGINE_TERM_WAIT_S
